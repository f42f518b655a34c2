"""The public `lipstream.Session`: the live render session (RenderSession) plus text, spoken through a voice.

The render room's RenderSession takes speech only; the talk room's Speaker turns text into speech. This module
sits above both (like the CLI) and puts them together for the Python API: `push_text` and
`push_text_stream` are the RenderSession's `push_speech_stream` fed by a Speaker.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable
from typing import Any

from lipstream.audio.speech import Speech
from lipstream.render import session as render_session
from lipstream.render.session_types import SessionConfig, SessionEvent
from lipstream.talk.voices.speaker import Speaker

__all__ = ["Session", "SessionConfig", "SessionEvent"]


class Session(render_session.RenderSession):
    """A live avatar session that also speaks text (`push_text`, `push_text_stream`)."""

    def __init__(self, *args: Any, speaker: Speaker | None = None, **options: Any) -> None:
        """The RenderSession's arguments (avatar, engine, config, ...), and `speaker`: the voices text goes
        through (default: load `config.voice` on first use, synthesis on the session's speech pool)."""
        super().__init__(*args, **options)
        self.speaker = speaker or Speaker(executor=self._pools.speech, default_voice=self.config.voice)

    async def push_text(self, text: str, voice: str | None = None) -> int:
        """Speak `text` one sentence at a time, starting from its first phrase (which plays while the rest is
        synthesised); returns the utterance id."""
        return await self.push_text_stream(text, voice=voice)

    async def push_text_stream(
        self,
        texts: AsyncIterable[str] | str,
        voice: str | None = None,
        on_utterance: Callable[[int], None] | None = None,
        on_audio: Callable[[Speech], None] | None = None,
    ) -> int:
        """Speak text that arrives in pieces (a language model's sentences) as one utterance, each piece
        synthesised when the session has room for it (the first piece's first phrase alone, so the first audio
        waits for a few words, not a sentence); a `text` event marks each sentence's first frame."""
        speeches = await self.speaker.speak(
            texts, voice or self.config.voice, on_speech=on_audio, quick_start=True
        )
        return await self.push_speech_stream(speeches, on_utterance=on_utterance)

"""Text in, speech out: sentences synthesised one at a time, as the consumer pulls them.

A live session pulls the next sentence only when it has room for it (its TTS look-ahead), so a long text
costs CPU and memory only as fast as it is spoken, and an interrupt simply stops the pulling.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator
from concurrent.futures import Executor
from typing import Any, TypeVar

from lipstream.audio.speech import Speech
from lipstream.talk.tts import TTS
from lipstream.talk.voices import SharedVoices

T = TypeVar("T")


async def one_text(text: str) -> AsyncIterator[str]:
    """A text stream of one piece."""
    yield text


class Speaker:
    """Turns text (whole, or arriving in pieces) into a stream of sentence Speech on a worker pool."""

    def __init__(
        self,
        voices: Callable[[str], TTS] | None = None,
        executor: Executor | None = None,
        default_voice: str = "piper",
    ) -> None:
        """`voices`: name -> loaded TTS (a server's SharedVoices); `executor`: where synthesis runs (a
        server's low-priority speech pool; None: asyncio's default executor)."""
        self.voices = voices or SharedVoices(threads=0, warm_up=False)
        self.executor = executor
        self.default_voice = default_voice

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(fn, *args))

    async def speak(
        self,
        texts: AsyncIterable[str] | str,
        voice: str | None = None,
        on_speech: Callable[[Speech], None] | None = None,
    ) -> AsyncIterator[Speech]:
        """Load the voice now (an unknown one raises here), then return the sentence stream of `texts`;
        `on_speech` sees each sentence as it is handed on."""
        tts = await self._run(self.voices, voice or self.default_voice)
        return self._sentences(tts, one_text(texts) if isinstance(texts, str) else texts, on_speech)

    async def _sentences(
        self, tts: TTS, texts: AsyncIterable[str], on_speech: Callable[[Speech], None] | None
    ) -> AsyncIterator[Speech]:
        async for text in texts:
            sentences: Iterator[Speech] = await self._run(lambda t=text: iter(tts.synthesize_sentences(t)))
            while True:
                speech = await self._run(next, sentences, None)
                if speech is None:
                    break
                if on_speech is not None:
                    on_speech(speech)
                yield speech

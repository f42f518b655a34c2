"""Text in, speech out: sentences synthesised one at a time, as the consumer pulls them.

A live session pulls the next sentence only when it has room for it (its TTS look-ahead), so a long text
costs CPU and memory only as fast as it is spoken, and an interrupt simply stops the pulling.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterator, MutableMapping
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

from lipstream.audio.speech import Speech
from lipstream.talk.voices.phrase_seam import end_at_cut, phrase_for_voice, start_at_cut
from lipstream.talk.voices.sentences import split_first_phrase
from lipstream.talk.voices.shared import SharedVoices
from lipstream.talk.voices.tts import TTS, in_pieces

T = TypeVar("T")

MAX_KEPT = 16  # sentences kept synthesised (a persona's unknown answer, per voice): the oldest go first
KeptSpeech = MutableMapping[tuple[str, str], "Future[list[Speech]]"]  # (voice, text) -> its speech


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
        kept: KeptSpeech | None = None,
    ) -> None:
        """`voices`: name -> loaded TTS (a server's SharedVoices); `executor`: where synthesis runs (a
        server's low-priority speech pool; None: asyncio's default executor); `kept`: sentences synthesised
        once and spoken again from memory, shared by the speakers given the same mapping."""
        self.voices = voices or SharedVoices(threads=0, warm_up=False)
        self.executor = executor
        self.default_voice = default_voice
        self._kept: KeptSpeech = {} if kept is None else kept

    def keep(self, text: str, voice: str | None = None) -> None:
        """Synthesise `text` on the executor now, once, and keep it: every later `speak` of exactly this
        text takes its speech from memory (a persona's unknown answer, said often). No executor: nothing."""
        key = (voice or self.default_voice, text)
        if self.executor is None or not text.strip() or key in self._kept:
            return

        def synthesise() -> list[Speech]:
            return list(self.voices(key[0]).synthesize_sentences(text))

        self._kept[key] = self.executor.submit(synthesise)
        while len(self._kept) > MAX_KEPT:
            del self._kept[next(iter(self._kept))]

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self.executor, functools.partial(fn, *args))

    async def speak(
        self,
        texts: AsyncIterable[str] | str,
        voice: str | None = None,
        on_speech: Callable[[Speech], None] | None = None,
        quick_start: bool = False,
    ) -> AsyncIterator[Speech]:
        """Load the voice now (an unknown one raises here), then return the sentence stream of `texts`;
        `on_speech` sees each sentence as it is handed on. With `quick_start`, the first text's first phrase
        is synthesised alone (`split_first_phrase`), and the rest while it plays, joined without a seam; a
        voice that `SpeaksInPieces` needs no cut: its first piece is short whatever the sentence, and a long
        first sentence's first piece comes from its first words (`SpeaksInPieces.synthesize_sentences`)."""
        name = voice or self.default_voice
        tts = await self._run(self.voices, name)
        stream = one_text(texts) if isinstance(texts, str) else texts
        return self._sentences(tts, stream, on_speech, quick_start, name)

    async def _sentences(
        self,
        tts: TTS,
        texts: AsyncIterable[str],
        on_speech: Callable[[Speech], None] | None,
        quick_start: bool,
        voice: str = "",
    ) -> AsyncIterator[Speech]:
        pieces_voice = in_pieces(tts)
        async for text in texts:
            ready = self._kept.get((voice, text))  # kept whole: spoken at once, never cut
            if ready is not None and not ready.cancelled():
                try:
                    speeches = await asyncio.wrap_future(ready)
                except Exception:  # noqa: BLE001 - a failed synthesis is tried again below
                    speeches = None
                if speeches is not None:
                    quick_start = False
                    for speech in speeches:
                        if on_speech is not None:
                            on_speech(speech)
                        yield speech
                    continue
            pieces = split_first_phrase(text) if quick_start and not pieces_voice else [text]
            # a voice in pieces starts its first text's long first sentence from its head instead of a cut
            synthesize = functools.partial(tts.synthesize_sentences, quick_start=True) if (
                quick_start and pieces_voice) else tts.synthesize_sentences  # fmt: skip
            quick_start = False  # the first text only: later ones are synthesised while earlier ones play
            for index, piece in enumerate(pieces):
                cut_after, cut_before = len(pieces) == 2 and index == 0, len(pieces) == 2 and index == 1
                spoken = phrase_for_voice(piece) if cut_after else piece
                sentences: Iterator[Speech]
                sentences = await self._run(lambda t=spoken, say=synthesize: iter(say(t)))
                while True:
                    speech = await self._run(next, sentences, None)
                    if speech is None:
                        break
                    if cut_after:
                        speech = end_at_cut(speech, piece)
                    elif cut_before:
                        speech, cut_before = start_at_cut(speech), False
                    if on_speech is not None:
                        on_speech(speech)
                    yield speech

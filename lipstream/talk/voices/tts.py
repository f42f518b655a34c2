"""Offline text-to-speech: the TTS interface and the factory that picks a voice."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Protocol, runtime_checkable

from lipstream.audio.speech import Speech
from lipstream.errors import SpeechError
from lipstream.talk.text import MAX_TEXT_CHARS
from lipstream.talk.voices.espeak_tts import EspeakTTS
from lipstream.talk.voices.piper_tts import PiperTTS

log = logging.getLogger(__name__)

VOICES = ("piper", "espeak")

__all__ = [
    "MAX_TEXT_CHARS", "VOICES", "EspeakTTS", "PiperTTS", "SpeaksInPieces", "TTS", "create_tts", "in_pieces",
]  # fmt: skip


@runtime_checkable
class TTS(Protocol):
    """A voice that turns text into 16 kHz Speech with IPA phoneme timings.

    Text must hold at least one letter or digit and at most MAX_TEXT_CHARS characters (SpeechError otherwise).
    """

    name: str

    def synthesize(self, text: str) -> Speech:
        """Speak the whole text as one utterance."""

    def synthesize_sentences(self, text: str) -> Iterator[Speech]:
        """Speak sentence by sentence, yielding each Speech as soon as it is ready (a voice that
        `SpeaksInPieces` yields a sentence in consecutive pieces, the first with its text and length)."""


@runtime_checkable
class SpeaksInPieces(Protocol):
    """A voice that makes each sentence a piece at a time, the first one short: its first audio comes without
    cutting the text (so no seam), and a speaker asked to start quickly leaves the text whole."""

    def speaks_in_pieces(self) -> bool:
        """Whether this loaded voice does (a Piper voice whose model could not be cut in stages does not)."""

    def synthesize_sentences(self, text: str, quick_start: bool = False) -> Iterator[Speech]:
        """As `TTS.synthesize_sentences`; with `quick_start`, a long first sentence's first pieces come from
        its first words' text side alone (the first audio does not wait for the whole sentence's)."""


def in_pieces(tts: TTS) -> bool:
    """Whether this loaded voice makes its sentences in pieces (`SpeaksInPieces`, its model allowing it)."""
    return isinstance(tts, SpeaksInPieces) and tts.speaks_in_pieces()


def create_tts(
    voice: str = "piper", fallback: bool = True, threads: int = 0, keep_arena: bool = False
) -> TTS:
    """Make a TTS: "piper" (bundled neural voice; falls back to espeak-ng if it cannot load) or "espeak".

    `threads`: CPU threads one Piper synthesis may use (0: onnxruntime's default, all cores); `keep_arena`:
    Piper keeps onnxruntime's memory arena (PiperTTS)."""
    if voice == "espeak":
        return EspeakTTS()
    if voice != "piper":
        raise SpeechError(f"unknown voice {voice!r}; choose one of {', '.join(VOICES)}")
    try:
        return PiperTTS(threads=threads, keep_arena=keep_arena)
    except SpeechError as exc:
        if not fallback:
            raise
        log.warning("Piper voice unavailable (%s); using espeak-ng instead", exc)
        return EspeakTTS()

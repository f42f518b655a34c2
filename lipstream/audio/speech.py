"""Plain data about speech: an utterance's PCM and its phoneme timings, shared by TTS, STT and engines."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from lipstream.audio.timeline import SAMPLE_RATE, frame_count


@dataclass(frozen=True)
class PhonemeTiming:
    """One phoneme of known timing (from our own TTS), in samples at SAMPLE_RATE."""

    phoneme: str  # IPA symbol as the TTS reports it
    start: int
    end: int


@dataclass
class Speech:
    """One utterance: float32 mono PCM at 16 kHz in [-1, 1], plus phoneme timings when known."""

    pcm: np.ndarray
    phonemes: Sequence[PhonemeTiming] | None = None
    text: str | None = None
    source: str = ""
    sample_rate: int = field(default=SAMPLE_RATE)
    # how many samples `text` spans when it goes on past this speech: the first piece of a sentence made in
    # pieces carries the sentence's text and length (its later pieces carry no text)
    text_samples: int | None = None

    def __post_init__(self) -> None:
        if self.sample_rate != SAMPLE_RATE:
            raise ValueError(f"Speech must be at {SAMPLE_RATE} Hz; resample first (got {self.sample_rate})")
        self.pcm = np.ascontiguousarray(self.pcm, dtype=np.float32).reshape(-1)

    @property
    def seconds(self) -> float:
        """Duration in seconds."""
        return len(self.pcm) / SAMPLE_RATE

    @property
    def frame_count(self) -> int:
        """Video frames this utterance covers: floor(seconds * 25)."""
        return frame_count(len(self.pcm))

"""The microphone's recent audio, addressed by stream sample, with when each part arrived."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np


@dataclass
class MicBuffer:
    """The microphone stream at 16 kHz: a window of recent audio (the whole turn while one is open)."""

    audio: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    offset: int = 0  # stream sample of audio[0]
    arrivals: deque = field(default_factory=lambda: deque(maxlen=400))  # (end sample, wall time)

    @property
    def end(self) -> int:
        """Stream samples received so far."""
        return self.offset + len(self.audio)

    def append(self, pcm: np.ndarray, now: float) -> None:
        """Add a chunk that reached the server at `now`."""
        self.audio = np.concatenate([self.audio, pcm])
        self.arrivals.append((self.end, now))

    def slice(self, start: int, end: int | None = None) -> np.ndarray:
        """Stream samples [start, end)."""
        lo = max(0, start - self.offset)
        hi = len(self.audio) if end is None else max(lo, end - self.offset)
        return self.audio[lo:hi]

    def keep_from(self, sample: int) -> None:
        """Forget audio before stream sample `sample`."""
        cut = max(0, min(len(self.audio), sample - self.offset))
        if cut:
            self.audio = self.audio[cut:]
            self.offset += cut

    def arrival_of(self, sample: int) -> float:
        """When the chunk holding stream sample `sample` reached the server."""
        for end, at in self.arrivals:
            if end > sample:
                return at
        return self.arrivals[-1][1] if self.arrivals else time.perf_counter()

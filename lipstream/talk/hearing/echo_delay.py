"""The echo canceller's helpers: the avatar's recent audio by pts, and the delay search (GCC-PHAT)."""

from __future__ import annotations

import math

import numpy as np

_EPS = 1e-12


class ReferenceBuffer:
    """The avatar's audio on the session timeline (pts in samples); positions never given read as 0."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._pcm = np.zeros(capacity, dtype=np.float64)
        # The pts stored in each slot: a slot holding another (older) pts reads as silence, so a ring
        # that wrapped or a gap in the timeline never leaks stale audio into the filter.
        self._tag = np.full(capacity, -1, dtype=np.int64)
        self.newest = -1  # highest pts written + 1 (0 when nothing yet)

    def write(self, pts: int, pcm: np.ndarray) -> None:
        """Store pcm (already float) at pts.. on the timeline, replacing what was there."""
        n = len(pcm)
        if n == 0 or pts < 0:
            return
        if n > self.capacity:
            pts, pcm, n = pts + n - self.capacity, pcm[-self.capacity :], self.capacity
        idx = np.arange(pts, pts + n) % self.capacity
        self._pcm[idx] = pcm
        self._tag[idx] = np.arange(pts, pts + n)
        self.newest = max(self.newest, pts + n)

    def read(self, start: int, end: int) -> np.ndarray:
        """Samples start..end-1 (zeros where nothing was given)."""
        n = max(0, end - start)
        # contiguous runs of the ring, two at most for a read no wider than it (sliced, not gathered: the
        # canceller reads ~10,000 samples a block per conversation, 7 % of a server's time with four
        # conversations when gathered); a slot whose tag is not the run's pts reads as silence
        out = np.empty(n, dtype=np.float64)
        first = start % self.capacity
        done = 0
        while done < n:
            slot = (first + done) % self.capacity
            run = min(n - done, self.capacity - slot)
            out[done : done + run] = self._pcm[slot : slot + run]
            stale = self._tag[slot : slot + run] != np.arange(start + done, start + done + run)
            out[done : done + run][stale] = 0.0
            done += run
        return out


class DelayEstimator:
    """GCC-PHAT over lags [-neg, max_lag] on cross-spectra smoothed across analysis blocks."""

    def __init__(self, max_lag: int, neg: int, block: int = 4096, hop: int = 2048) -> None:
        self.max_lag, self.neg, self.block, self.hop = max_lag, neg, block, hop
        self.nfft = 1 << math.ceil(math.log2(block + max_lag + neg))
        self._cross: np.ndarray | None = None
        freqs = np.fft.rfftfreq(self.nfft, 1 / 16000)
        # Speech below 100 Hz is mostly room rumble and above 7 kHz often empty in TTS output: whitened,
        # those bins would only add phase noise to the correlation.
        self._band = ((freqs >= 100) & (freqs <= 7000)).astype(np.float64)
        self.lag: int | None = None
        self.confidence = 0.0
        self._candidate: int | None = None

    def reset(self) -> None:
        """Forget the smoothed cross-spectrum (the timeline mapping changed)."""
        self._cross = None
        self._candidate = None

    def update(self, mic: np.ndarray, ref: np.ndarray) -> bool:
        """Add one analysis block: mic (block samples), ref (block + max_lag + neg samples, starting max_lag
        before mic). Return True when the accepted lag changed."""
        spec_m = np.fft.rfft(mic, self.nfft)
        spec_r = np.fft.rfft(ref, self.nfft)
        cross = np.conj(spec_m) * spec_r
        self._cross = cross if self._cross is None else 0.6 * self._cross + 0.4 * cross
        mag = np.abs(self._cross)
        # PHAT with a floor: bins far below the strongest carry no phase information worth whitening.
        weighted = self._cross * self._band / (mag + 1e-3 * mag.max() + _EPS)
        corr = np.fft.irfft(weighted, self.nfft)[: self.max_lag + self.neg + 1]
        k = int(np.argmax(corr))
        rest = np.delete(corr, np.s_[max(0, k - 8) : k + 9])
        self.confidence = float(corr[k] / (np.sqrt(np.mean(rest**2)) + _EPS))
        lag = self.max_lag - k
        if self.confidence < 8.0:
            return False
        if self.lag is None:
            # The first lock too must show up twice in a row: a single block can peak on a coincidence
            # (the reference of frames that arrived too late to be played, a repeated syllable).
            if self._candidate is not None and abs(lag - self._candidate) <= 2:
                self.lag, self._candidate = lag, None
                return True
            self._candidate = lag
            return False
        if abs(lag - self.lag) <= 2:
            self._candidate = None
            return False
        # A different lag must show up twice in a row before it replaces an accepted one.
        if self._candidate is not None and abs(lag - self._candidate) <= 2:
            self.lag, self._candidate = lag, None
            return True
        self._candidate = lag
        return False

"""Audio -> per-frame acoustic features for the articulation model (numpy only, frame-local)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lipstream.audio.timeline import SAMPLE_RATE, SAMPLES_PER_FRAME

HOP = SAMPLES_PER_FRAME // 4  # 10 ms: four analysis hops per 40 ms video frame
WINDOW = 400  # 25 ms
N_FFT = 512
# Analysis windows reach this many samples past their frame's end (last hop centre + half window).
OVERHANG = HOP * 3 + HOP // 2 + WINDOW // 2 - SAMPLES_PER_FRAME
ENERGY_FLOOR = 1e-10


def _mel_filterbank(n_mels: int, n_fft: int, rate: int, fmin: float, fmax: float) -> np.ndarray:
    """Triangular mel filters [n_mels, n_fft//2+1] (HTK mel scale)."""

    def to_mel(f: np.ndarray | float) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + np.asarray(f) / 700.0)

    def to_hz(m: np.ndarray) -> np.ndarray:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    edges = to_hz(np.linspace(to_mel(fmin), to_mel(fmax), n_mels + 2))
    bins = np.fft.rfftfreq(n_fft, 1.0 / rate)
    fb = np.zeros((n_mels, bins.size))
    for i in range(n_mels):
        lo, mid, hi = edges[i], edges[i + 1], edges[i + 2]
        fb[i] = np.clip(np.minimum((bins - lo) / (mid - lo), (hi - bins) / (hi - mid)), 0.0, None)
    return fb.astype(np.float32)


@dataclass(frozen=True)
class AcousticConfig:
    """Front-end settings; stored with the model weights so training and inference agree."""

    n_mels: int = 24
    fmin: float = 80.0
    fmax: float = 7600.0


class AcousticFrontEnd:
    """Log-mel shape (gain-invariant) plus level in dBFS, averaged per 40 ms frame."""

    def __init__(self, config: AcousticConfig | None = None) -> None:
        self.config = config or AcousticConfig()
        self._fb = _mel_filterbank(self.config.n_mels, N_FFT, SAMPLE_RATE, self.config.fmin, self.config.fmax)
        self._window = np.hanning(WINDOW).astype(np.float32)

    @property
    def dim(self) -> int:
        """Features per frame: n_mels spectral shape + 1 level + 1 level change."""
        return self.config.n_mels + 2

    def frames(self, pcm: np.ndarray, first_frame: int, n_frames: int) -> np.ndarray:
        """Features [n_frames, dim] for frames first_frame.. of `pcm` (zero-padded beyond its ends)."""
        if n_frames <= 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        # Hop centres of the wanted frames, in samples of pcm; one extra hop before for the level change.
        hop0 = first_frame * 4 - 1
        n_hops = n_frames * 4 + 1
        centres = (hop0 + np.arange(n_hops)) * HOP + HOP // 2
        lo = centres[0] - WINDOW // 2
        hi = centres[-1] + WINDOW // 2
        seg = np.zeros(hi - lo, dtype=np.float32)
        a, b = max(lo, 0), min(hi, pcm.size)
        if b > a:
            seg[a - lo : b - lo] = pcm[a:b]
        idx = (centres - lo - WINDOW // 2)[:, None] + np.arange(WINDOW)[None, :]
        spec = np.abs(np.fft.rfft(seg[idx] * self._window, n=N_FFT, axis=1)) ** 2
        mel = spec @ self._fb.T + ENERGY_FLOOR
        logmel = np.log10(mel)
        level = np.log10(np.mean(seg[idx] ** 2, axis=1) + ENERGY_FLOOR)  # per hop
        hop_level = level[1:].reshape(n_frames, 4)
        shape = (logmel[1:] - logmel[1:].mean(axis=1, keepdims=True)).reshape(n_frames, 4, -1).mean(axis=1)
        frame_level = hop_level.mean(axis=1)
        # Onsets and releases show as level steps inside the frame (first hop vs previous frame's last).
        change = hop_level[:, -1] - np.concatenate([[level[0]], hop_level[:-1, -1]])
        return np.concatenate([shape, frame_level[:, None], change[:, None]], axis=1).astype(np.float32)

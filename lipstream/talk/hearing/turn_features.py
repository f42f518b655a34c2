"""Whisper-style log-mel features of the last 8 s of a turn: the input of the Smart Turn end-of-turn model.

The model was trained on the features of Hugging Face's WhisperFeatureExtractor (80 mel bands, 25 ms windows
every 10 ms, 8 s chunks, waveform normalisation on); this is the same computation in numpy, written for
lipstream and checked against that extractor in tests/test_turn_end.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lipstream.audio.timeline import SAMPLE_RATE

CHUNK_SECONDS = 8
CHUNK_SAMPLES = CHUNK_SECONDS * SAMPLE_RATE
N_FFT = 400  # 25 ms
HOP = 160  # 10 ms
N_MELS = 80
N_FRAMES = CHUNK_SAMPLES // HOP  # 800
MEL_FLOOR = 1e-10
NORM_EPSILON = 1e-7


def _slaney_mel(hz: np.ndarray) -> np.ndarray:
    """Hz to the Slaney mel scale: linear below 1 kHz, logarithmic above."""
    hz = np.asarray(hz, dtype=np.float64)
    linear = hz * 3.0 / 200.0
    log_step = np.log(6.4) / 27.0
    above = 15.0 + np.log(np.maximum(hz, 1e-9) / 1000.0) / log_step
    return np.where(hz >= 1000.0, above, linear)


def _slaney_hz(mel: np.ndarray) -> np.ndarray:
    """The Slaney mel scale back to Hz."""
    mel = np.asarray(mel, dtype=np.float64)
    log_step = np.log(6.4) / 27.0
    return np.where(mel >= 15.0, 1000.0 * np.exp(log_step * (mel - 15.0)), mel * 200.0 / 3.0)


def mel_filterbank(n_mels: int = N_MELS, n_fft: int = N_FFT, rate: int = SAMPLE_RATE) -> np.ndarray:
    """Triangular filters on the Slaney mel scale, area-normalised: [n_fft // 2 + 1, n_mels]."""
    bins = np.linspace(0.0, rate / 2.0, n_fft // 2 + 1)
    edges = _slaney_hz(np.linspace(_slaney_mel(0.0), _slaney_mel(rate / 2.0), n_mels + 2))
    widths = np.diff(edges)
    rising = (bins[:, None] - edges[None, :-2]) / widths[None, :-1]
    falling = (edges[None, 2:] - bins[:, None]) / widths[None, 1:]
    filters = np.maximum(0.0, np.minimum(rising, falling))
    return filters * (2.0 / (edges[2:] - edges[:-2]))[None, :]


@dataclass
class TurnFeatures:
    """Computes the model's [80, 800] input from the end of a turn (reusable; not thread-safe)."""

    filters: np.ndarray = field(default_factory=mel_filterbank)
    window: np.ndarray = field(default_factory=lambda: np.hanning(N_FFT + 1)[:-1])  # periodic Hann

    def __call__(self, audio: np.ndarray) -> np.ndarray:
        """16 kHz float audio (any length; its last 8 s are used, a shorter turn is padded with silence
        before it) -> float32 log-mel [80, 800]."""
        chunk = last_chunk(audio)
        # the whole 8 s chunk, padding included, is normalised: what the model saw in training
        chunk = (chunk - chunk.mean()) / np.sqrt(chunk.var() + NORM_EPSILON)
        padded = np.pad(chunk.astype(np.float64), N_FFT // 2, mode="reflect")
        frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:N_FRAMES]
        power = np.abs(np.fft.rfft(frames * self.window, axis=-1)) ** 2
        log_mel = np.log10(np.maximum(power @ self.filters, MEL_FLOOR)).T
        log_mel = np.maximum(log_mel, log_mel.max() - 8.0)
        return ((log_mel + 4.0) / 4.0).astype(np.float32)


def last_chunk(audio: np.ndarray) -> np.ndarray:
    """The last 8 s of `audio` as float32, left-padded with zeros when the turn is shorter."""
    audio = np.asarray(audio, dtype=np.float32).reshape(-1)[-CHUNK_SAMPLES:]
    if len(audio) == CHUNK_SAMPLES:
        return audio
    return np.concatenate([np.zeros(CHUNK_SAMPLES - len(audio), np.float32), audio])

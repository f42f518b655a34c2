"""Audio in: decode any file FFmpeg reads to 16 kHz mono float32, and resample PCM held in memory."""

from __future__ import annotations

import os
from pathlib import Path

import av
import numpy as np

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.errors import MediaError

_INT16_SCALE = 32768.0


def to_float32(pcm: np.ndarray) -> np.ndarray:
    """Convert int16 PCM (or pass through float PCM) to float32 in [-1, 1]."""
    arr = np.asarray(pcm)
    if arr.dtype == np.int16:
        return arr.astype(np.float32) / _INT16_SCALE
    if np.issubdtype(arr.dtype, np.floating):
        return arr.astype(np.float32, copy=False)
    raise MediaError(f"PCM must be int16 or float, got dtype {arr.dtype}; convert the samples first")


def to_int16(pcm: np.ndarray) -> np.ndarray:
    """Convert float PCM in [-1, 1] to int16, clipping out-of-range samples (int16 passes through)."""
    arr = np.asarray(pcm)
    if arr.dtype == np.int16:
        return arr
    scaled = np.rint(to_float32(arr) * _INT16_SCALE)
    return np.clip(scaled, -32768, 32767).astype(np.int16)


def _make_resampler(rate_out: int) -> av.AudioResampler:
    """A libswresample converter to float32 mono at rate_out."""
    return av.AudioResampler(format="flt", layout="mono", rate=rate_out)


def _frames_to_array(frames: list[av.AudioFrame]) -> np.ndarray:
    """Concatenate packed mono float frames from a resampler into one 1-D float32 array."""
    if not frames:
        return np.zeros(0, dtype=np.float32)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.float32, copy=False)


class StreamResampler:
    """Resample a stream of mono PCM chunks, keeping filter state so chunk boundaries do not click."""

    def __init__(self, rate_in: int, rate_out: int = SAMPLE_RATE) -> None:
        """Create a resampler from rate_in to rate_out (Hz)."""
        if rate_in <= 0 or rate_out <= 0:
            raise MediaError(f"sample rates must be positive (got {rate_in} -> {rate_out})")
        self.rate_in = rate_in
        self.rate_out = rate_out
        self._resampler = None if rate_in == rate_out else _make_resampler(rate_out)
        self._pts = 0

    def push(self, pcm: np.ndarray) -> np.ndarray:
        """Feed one chunk (int16 or float, 1-D mono); return the float32 samples ready so far."""
        chunk = np.ascontiguousarray(to_float32(pcm).reshape(-1))
        if self._resampler is None:
            return chunk.copy()
        if chunk.size == 0:
            return np.zeros(0, dtype=np.float32)
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate = self.rate_in
        frame.pts = self._pts
        self._pts += chunk.size
        return _frames_to_array(self._resampler.resample(frame))

    def flush(self) -> np.ndarray:
        """End of stream: return the samples still held in the filter; the object can then be reused."""
        if self._resampler is None:
            return np.zeros(0, dtype=np.float32)
        tail = _frames_to_array(self._resampler.resample(None))
        self._resampler = _make_resampler(self.rate_out)
        self._pts = 0
        return tail


def resample(pcm: np.ndarray, rate_in: int, rate_out: int = SAMPLE_RATE) -> np.ndarray:
    """Resample a whole mono PCM buffer (int16 or float) to float32 at rate_out."""
    stream = StreamResampler(rate_in, rate_out)
    head = stream.push(pcm)
    return np.concatenate([head, stream.flush()])


def load_audio(path: str | os.PathLike) -> np.ndarray:
    """Decode the first audio stream of any audio or video file FFmpeg reads to float32 mono 16 kHz."""
    file = Path(path)
    if not file.exists():
        raise MediaError(f"audio file not found: {file}; check the path")
    if not file.is_file():
        raise MediaError(f"audio path is not a file: {file}; pass an audio or video file")
    try:
        container = av.open(str(file))
    except (av.error.FFmpegError, OSError, UnicodeDecodeError) as exc:
        raise MediaError(
            f"cannot read {file.name} as audio or video ({exc}); use a WAV, MP3, MP4 or similar"
        ) from exc
    with container:
        if not container.streams.audio:
            raise MediaError(f"{file.name} has no audio stream; pass a file with sound")
        stream = container.streams.audio[0]
        resampler = _make_resampler(SAMPLE_RATE)
        parts: list[np.ndarray] = []
        try:
            for frame in container.decode(stream):
                frame.pts = None  # swresample counts samples itself; odd container pts must not add gaps
                parts.append(_frames_to_array(resampler.resample(frame)))
            parts.append(_frames_to_array(resampler.resample(None)))
        except av.error.FFmpegError as exc:
            raise MediaError(f"audio in {file.name} is corrupt or unsupported ({exc}); re-encode it") from exc
    pcm = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    return np.ascontiguousarray(pcm, dtype=np.float32)

"""Audio in: decode files and uploaded bytes FFmpeg reads to 16 kHz mono float32; resample PCM in memory."""

from __future__ import annotations

import io
import os
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.errors import MediaError

_INT16_SCALE = 32768.0
MAX_UPLOAD_CHANNELS = 8  # more is no speech recording, only more decoding work per second
_DECLARED_SLACK_S = 0.5  # header durations may exceed the real length a little (see _check_declared)


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


@dataclass(frozen=True)
class _Limits:
    """What an upload may declare and hold, checked before and while decoding."""

    max_seconds: float
    min_rate: int
    max_rate: int


class _Mixdown:
    """Decoded frames to 16 kHz mono float32; a new converter when the input format changes mid-stream."""

    def __init__(self) -> None:
        self._resampler: av.AudioResampler | None = None
        self._key: tuple | None = None
        self._parts: list[np.ndarray] = []

    def push(self, frame: av.AudioFrame) -> None:
        """Convert one decoded frame and keep its samples."""
        key = (frame.sample_rate, frame.layout.name, frame.format.name)
        if key != self._key:
            # PyAV's resampler refuses frames unlike its first one; flush it and start a new one instead
            self._flush()
            self._resampler, self._key = _make_resampler(SAMPLE_RATE), key
        frame.pts = None  # swresample counts samples itself; odd container pts must not add gaps
        self._parts.append(_frames_to_array(self._resampler.resample(frame)))

    def _flush(self) -> None:
        if self._resampler is not None:
            self._parts.append(_frames_to_array(self._resampler.resample(None)))

    def finish(self) -> np.ndarray:
        """All converted samples as one contiguous float32 array."""
        self._flush()
        self._resampler, self._key = None, None
        pcm = np.concatenate(self._parts) if self._parts else np.zeros(0, dtype=np.float32)
        self._parts = []
        return np.ascontiguousarray(pcm, dtype=np.float32)


def _reason(exc: Exception) -> str:
    """FFmpeg's reason without the file name it appends (for uploads that name is a server path)."""
    return getattr(exc, "strerror", None) or type(exc).__name__


def _open_error(label: str, exc: Exception) -> MediaError:
    return MediaError(
        f"cannot read {label} as audio or video ({_reason(exc)}); use a WAV, MP3, MP4 or similar"
    )


def _check_rate(rate: int, limits: _Limits, label: str, where: str) -> None:
    if not limits.min_rate <= rate <= limits.max_rate:
        raise MediaError(
            f"{label} {where} a sample rate of {rate} Hz, outside the allowed "
            f"{limits.min_rate}–{limits.max_rate} Hz; re-encode it at 16, 44.1 or 48 kHz"
        )


def _declared_seconds(container: av.container.InputContainer, stream: av.audio.AudioStream) -> float | None:
    """Duration the header states (stream first, then container), or None when it states none."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return container.duration / av.time_base
    return None


def _too_long(label: str, limits: _Limits) -> MediaError:
    return MediaError(
        f"{label} is longer than {limits.max_seconds:g} s; send at most {limits.max_seconds:g} s of audio"
    )


def _check_declared(
    container: av.container.InputContainer, stream: av.audio.AudioStream, limits: _Limits, label: str
) -> None:
    """Refuse what the header already shows is unacceptable, before any audio is decoded."""
    _check_rate(stream.sample_rate or 0, limits, label, "declares")
    if (stream.channels or 0) > MAX_UPLOAD_CHANNELS:
        raise MediaError(
            f"{label} declares {stream.channels} channels; send mono or stereo "
            f"(at most {MAX_UPLOAD_CHANNELS} channels)"
        )
    declared = _declared_seconds(container, stream)
    # headers carry encoder padding and MP3 durations are estimated from the bitrate, so allow a little
    if declared is not None and declared > limits.max_seconds + _DECLARED_SLACK_S:
        raise _too_long(label, limits)


def _decode_stream(
    container: av.container.InputContainer, label: str, limits: _Limits | None = None
) -> np.ndarray:
    """Decode the first audio stream to 16 kHz mono float32, enforcing `limits` when given."""
    if not container.streams.audio:
        raise MediaError(f"{label} has no audio stream; pass a file with sound")
    stream = container.streams.audio[0]
    if limits is not None:
        _check_declared(container, stream, limits, label)
    mixdown = _Mixdown()
    seconds = Fraction(0)  # exact, so a file of exactly the limit is not refused by rounding
    try:
        for frame in container.decode(stream):
            if limits is not None:
                # headers can lie: the rate of every frame and the running length are checked as we go
                _check_rate(frame.sample_rate, limits, label, "switches mid-stream to")
                seconds += Fraction(frame.samples, frame.sample_rate)
                if seconds > limits.max_seconds:
                    raise _too_long(label, limits)
            mixdown.push(frame)
    except (av.error.FFmpegError, ValueError) as exc:
        reason = _reason(exc)
        raise MediaError(f"audio in {label} is corrupt or unsupported ({reason}); re-encode it") from exc
    return mixdown.finish()


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
        raise _open_error(file.name, exc) from exc
    with container:
        return _decode_stream(container, file.name)


def decode_upload(data: bytes, max_seconds: float, min_rate: int = 8000, max_rate: int = 48000) -> np.ndarray:
    """Decode an uploaded file's bytes to float32 mono 16 kHz, refusing it as early as it breaks a limit."""
    if not data:
        raise MediaError("the upload is empty; send the bytes of an audio file (WAV, MP3, OGG, ...)")
    limits = _Limits(max_seconds=max_seconds, min_rate=min_rate, max_rate=max_rate)
    try:
        # from memory, not a temp file: nothing on disk, and no server path in FFmpeg's messages
        container = av.open(io.BytesIO(data), mode="r")
    except (av.error.FFmpegError, OSError, UnicodeDecodeError, ValueError) as exc:
        raise _open_error("the upload", exc) from exc
    with container:
        pcm = _decode_stream(container, "the upload", limits)
    if pcm.size == 0:
        raise MediaError("the upload decodes to no audio samples; send a file that holds sound")
    return pcm

"""Decoding and resampling: real files written by espeak-ng and the ffmpeg CLI."""

from __future__ import annotations

import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest

from lipstream.audio.decode import StreamResampler, load_audio, resample, to_float32, to_int16
from lipstream.errors import MediaError


def _sine(rate: int, seconds: float, freq: float = 440.0, amp: float = 0.5) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (amp * np.sin(2 * np.pi * freq * t)).astype(np.float32)


def _write_wav(path: Path, pcm16: np.ndarray, rate: int, channels: int = 1) -> Path:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(channels)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(pcm16.tobytes())
    return path


def _lag(a: np.ndarray, b: np.ndarray, max_lag: int = 200) -> int:
    """Lag (samples) of b relative to a that maximises their correlation."""
    n = min(len(a), len(b)) - 2 * max_lag
    lags = range(-max_lag, max_lag + 1)
    scores = [float(np.dot(a[max_lag : max_lag + n], b[max_lag + k : max_lag + k + n])) for k in lags]
    return list(lags)[int(np.argmax(scores))]


def test_int16_float_round_trip() -> None:
    pcm = np.array([-32768, -1, 0, 1, 32767], dtype=np.int16)
    assert np.array_equal(to_int16(to_float32(pcm)), pcm)
    assert to_int16(np.array([2.0, -2.0], dtype=np.float32)).tolist() == [32767, -32768]
    with pytest.raises(MediaError, match="int16 or float"):
        to_float32(np.array([1, 2], dtype=np.int32))


def test_resample_keeps_timing_and_pitch() -> None:
    src = _sine(22050, 1.0)
    out = resample(src, 22050)
    assert out.dtype == np.float32 and len(out) == 16000
    ref = _sine(16000, 1.0)
    assert _lag(ref, out) == 0
    assert np.abs(out[200:-200] - ref[200:-200]).max() < 1e-3


def test_resample_int16_input() -> None:
    out = resample(to_int16(_sine(48000, 0.5)), 48000)
    assert out.dtype == np.float32 and len(out) == 8000
    assert 0.45 < np.abs(out).max() < 0.55


def test_stream_resampler_chunks_match_whole_buffer() -> None:
    src = _sine(44100, 1.0, freq=300)
    whole = resample(src, 44100)
    stream = StreamResampler(44100)
    rng = np.random.default_rng(0)
    parts, pos = [], 0
    while pos < len(src):
        size = int(rng.integers(1, 3000))
        parts.append(stream.push(src[pos : pos + size]))
        pos += size
    parts.append(stream.flush())
    chunked = np.concatenate(parts)
    assert len(chunked) == len(whole)
    # No click at chunk boundaries: the chunked stream equals the one-shot result.
    assert np.abs(chunked - whole).max() < 1e-5


def test_stream_resampler_same_rate_is_identity() -> None:
    src = _sine(16000, 0.1)
    stream = StreamResampler(16000)
    out = np.concatenate([stream.push(src[:500]), stream.push(src[500:]), stream.flush()])
    assert np.array_equal(out, src)


def test_load_wav_stereo_48k(tmp_path: Path) -> None:
    mono = to_int16(_sine(48000, 0.5))
    stereo = np.stack([mono, mono], axis=1).reshape(-1)
    pcm = load_audio(_write_wav(tmp_path / "s.wav", stereo, 48000, channels=2))
    assert pcm.dtype == np.float32 and len(pcm) == 8000
    assert _lag(_sine(16000, 0.5), pcm) == 0


def test_load_espeak_wav(tmp_path: Path) -> None:
    wav = tmp_path / "speech.wav"
    subprocess.run(["espeak-ng", "-v", "en-us", "-w", str(wav), "Good evening."], check=True)
    pcm = load_audio(wav)
    with wave.open(str(wav)) as w:
        seconds = w.getnframes() / w.getframerate()
    assert abs(len(pcm) / 16000 - seconds) < 0.002
    assert np.abs(pcm).max() > 0.05


def _ffmpeg_clip(path: Path, seconds: float, extra_inputs_and_codecs: list[str]) -> Path:
    """A small H.264 test-pattern clip made by the ffmpeg CLI, with optional extra inputs (audio)."""
    video = ["-f", "lavfi", "-i", "testsrc2=size=64x64:rate=25"]
    subprocess.run(
        ["ffmpeg", "-v", "error", *video, *extra_inputs_and_codecs, "-t", str(seconds), "-c:v", "libx264"]
        + [str(path)],
        check=True,
    )
    return path


def test_load_audio_from_video_file(tmp_path: Path) -> None:
    sine = ["-f", "lavfi", "-i", "sine=frequency=500:sample_rate=44100", "-c:a", "aac"]
    mp4 = _ffmpeg_clip(tmp_path / "clip.mp4", 1.0, sine)
    pcm = load_audio(mp4)
    assert abs(len(pcm) - 16000) < 400
    spectrum = np.abs(np.fft.rfft(pcm[2000:10000]))
    assert abs(np.argmax(spectrum) * 16000 / 8000 - 500) < 4


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(MediaError, match="not found"):
        load_audio(tmp_path / "nope.wav")


def test_directory_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(MediaError, match="not a file"):
        load_audio(tmp_path)


def test_unreadable_file(tmp_path: Path) -> None:
    junk = tmp_path / "junk.wav"
    junk.write_bytes(b"this is not audio at all" * 10)
    with pytest.raises(MediaError, match="cannot read junk.wav"):
        load_audio(junk)


def test_video_without_audio(tmp_path: Path) -> None:
    mp4 = _ffmpeg_clip(tmp_path / "silent.mp4", 0.4, [])
    with pytest.raises(MediaError, match="no audio stream"):
        load_audio(mp4)

"""Mp4Writer: real libx264 + AAC files, checked as a player decodes them (ffmpeg / ffprobe CLI)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from skimage.data import astronaut

from lipstream.errors import MediaError
from lipstream.media.mp4 import Mp4Writer

W, H = 128, 96


def _probe(path: Path) -> dict:
    out = subprocess.run(
        [
            "ffprobe",
            "-v",
            "error",
            "-count_frames",
            "-show_streams",
            "-show_format",
            "-of",
            "json",
            str(path),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


def _decoded_audio(path: Path) -> np.ndarray:
    out = subprocess.run(
        ["ffmpeg", "-v", "error", "-i", str(path), "-vn", "-ac", "1", "-ar", "16000", "-f", "s16le", "-"],
        check=True,
        capture_output=True,
    ).stdout
    return np.frombuffer(out, dtype=np.int16).astype(np.float32) / 32768.0


def _offset_samples(source: np.ndarray, decoded: np.ndarray, max_lag: int = 2000) -> int:
    """Lag of the decoded track against the source that maximises their correlation (+ = audio late)."""
    n = min(len(source), len(decoded)) - 2 * max_lag
    scores = [
        float(np.dot(source[max_lag : max_lag + n], decoded[max_lag + k : max_lag + k + n]))
        for k in range(-max_lag, max_lag + 1)
    ]
    return int(np.argmax(scores)) - max_lag


def _frames(n: int) -> list[np.ndarray]:
    face = np.ascontiguousarray(astronaut()[:H, :W])
    return [np.roll(face, 3 * i, axis=1) for i in range(n)]


def _bursty_audio(seconds: float) -> np.ndarray:
    """Noise bursts under a syllable-like envelope: one sharp correlation peak."""
    rng = np.random.default_rng(7)
    t = np.arange(int(16000 * seconds)) / 16000
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4 * t) ** 2
    return (0.3 * envelope * rng.standard_normal(t.size)).astype(np.float32)


def test_frame_count_duration_and_av_offset(tmp_path: Path) -> None:
    out = tmp_path / "out.mp4"
    audio = _bursty_audio(3.0)
    frames = _frames(75)
    rng = np.random.default_rng(1)
    with Mp4Writer(out, W, H) as writer:
        pos = 0
        for frame in frames:
            writer.write_frame(frame)
            step = int(rng.integers(100, 1500))  # audio arrives in ragged chunks, as from a stream
            writer.write_audio(audio[pos : pos + step])
            pos += step
        writer.write_audio((audio[pos:] * 32767).astype(np.int16))
    info = _probe(out)
    video = next(s for s in info["streams"] if s["codec_type"] == "video")
    sound = next(s for s in info["streams"] if s["codec_type"] == "audio")
    assert video["codec_name"] == "h264" and video["pix_fmt"] == "yuv420p"
    assert (video["width"], video["height"]) == (W, H)
    assert int(video["nb_read_frames"]) == 75
    assert video["avg_frame_rate"] == "25/1"
    assert sound["codec_name"] == "aac" and int(sound["sample_rate"]) == 16000
    assert abs(float(info["format"]["duration"]) - 3.0) < 0.05
    decoded = _decoded_audio(out)
    assert abs(len(decoded) - len(audio)) < 1024
    offset = _offset_samples(audio, decoded)
    assert abs(offset) < 80, f"A/V offset {offset / 16:.1f} ms"  # 5 ms at 16 kHz
    assert not list(tmp_path.glob(".*.part"))


def test_first_frame_matches_source(tmp_path: Path) -> None:
    out = tmp_path / "pic.mp4"
    frames = _frames(5)
    with Mp4Writer(out, W, H, crf=12) as writer:
        for frame in frames:
            writer.write_frame(frame)
        writer.write_audio(np.zeros(3200, np.float32))
    raw = subprocess.run(
        [
            "ffmpeg",
            "-v",
            "error",
            "-i",
            str(out),
            "-frames:v",
            "1",
            "-f",
            "rawvideo",
            "-pix_fmt",
            "rgb24",
            "-",
        ],
        check=True,
        capture_output=True,
    ).stdout
    first = np.frombuffer(raw, np.uint8).reshape(H, W, 3).astype(np.float64)
    mse = np.mean((first - frames[0]) ** 2)
    assert 10 * np.log10(255**2 / mse) > 30  # colours survive: BT.601 conversion matches the tagged matrix


def test_error_removes_partial_file(tmp_path: Path) -> None:
    out = tmp_path / "broken.mp4"
    with pytest.raises(MediaError, match=r"uint8 RGB of shape \(96, 128, 3\)"):
        with Mp4Writer(out, W, H) as writer:
            writer.write_frame(_frames(1)[0])
            writer.write_frame(np.zeros((10, 10, 3), np.uint8))
    assert list(tmp_path.iterdir()) == []


def test_existing_target_survives_failed_write(tmp_path: Path) -> None:
    out = tmp_path / "keep.mp4"
    out.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with Mp4Writer(out, W, H) as writer:
            writer.write_frame(_frames(1)[0])
            raise RuntimeError("render failed")
    assert out.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["keep.mp4"]


def test_unwritable_targets(tmp_path: Path) -> None:
    with pytest.raises(MediaError, match="does not exist"):
        Mp4Writer(tmp_path / "missing" / "out.mp4", W, H)
    with pytest.raises(MediaError, match="is a folder"):
        Mp4Writer(tmp_path, W, H)
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root ignores mode bits; sysfs refuses new files even to root
            with pytest.raises(MediaError, match="cannot create a file in /sys"):
                Mp4Writer("/sys/out.mp4", W, H)
        else:
            with pytest.raises(MediaError, match="permission denied"):
                Mp4Writer(locked / "out.mp4", W, H)
    finally:
        locked.chmod(0o700)


def test_odd_size_and_closed_writer(tmp_path: Path) -> None:
    with pytest.raises(MediaError, match="even"):
        Mp4Writer(tmp_path / "odd.mp4", 127, 96)
    writer = Mp4Writer(tmp_path / "c.mp4", W, H)
    writer.write_frame(_frames(1)[0])
    writer.close()
    with pytest.raises(MediaError, match="already closed"):
        writer.write_frame(_frames(1)[0])
    assert (tmp_path / "c.mp4").stat().st_size > 0

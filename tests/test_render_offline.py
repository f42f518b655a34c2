"""`lipstream render` end to end: real TTS, real engine, real H.264/AAC encode, checked with ffprobe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from lipstream.audio.timeline import SAMPLE_RATE

# each test runs the render CLI end to end (2.5-4.4 s): the full tier
pytestmark = pytest.mark.slow


def _run(*args: str, env_home: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if env_home is not None:
        env["LIPSTREAM_HOME"] = str(env_home)
    return subprocess.run(
        [sys.executable, "-m", "lipstream", *args], capture_output=True, text=True, timeout=300, env=env
    )


def _write_wav(path: Path, pcm: np.ndarray, rate: int = SAMPLE_RATE) -> Path:
    data = np.clip(np.round(pcm * 32767), -32768, 32767).astype("<i2")
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes(data.tobytes())
    return path


def _probe(path: Path) -> dict:
    out = subprocess.run(
        ["ffprobe", "-v", "error", "-count_frames", "-show_streams", "-of", "json", str(path)],
        capture_output=True, text=True, check=True,
    )
    return {s["codec_type"]: s for s in json.loads(out.stdout)["streams"]}


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory) -> tuple[Path, float]:
    from lipstream.talk.voices.tts import create_tts

    speech = create_tts("espeak").synthesize("Good evening. The bridge reopened today after three years.")
    path = _write_wav(tmp_path_factory.mktemp("speech") / "speech.wav", speech.pcm)
    return path, speech.seconds


def test_render_audio_file_to_mp4(small_avatar, speech_wav, tmp_path: Path) -> None:
    wav, seconds = speech_wav
    out, report = tmp_path / "out.mp4", tmp_path / "report.json"
    res = _run(
        "render", "--avatar", small_avatar.name, "--avatars-dir", str(small_avatar.path.parent),
        "--audio", str(wav), "-o", str(out), "--report", str(report), "--no-progress",
    )
    assert res.returncode == 0, res.stderr
    streams = _probe(out)
    expected = int(seconds * 25)
    assert abs(int(streams["video"]["nb_read_frames"]) - expected) <= 1
    assert (int(streams["video"]["width"]), int(streams["video"]["height"])) == small_avatar.size
    assert streams["video"]["codec_name"] == "h264" and streams["audio"]["codec_name"] == "aac"
    rep = json.loads(report.read_text())
    for key in ("engine", "frames", "fps", "audio_seconds", "wall_seconds", "realtime_factor", "stage_ms"):
        assert key in rep
    assert rep["engine"] == "viseme" and rep["frames"] == expected
    assert set(rep["stage_ms"]) >= {"features", "engine", "compositor", "encode"}
    assert rep["realtime_factor"] == pytest.approx(rep["audio_seconds"] / rep["wall_seconds"], rel=0.01)


def test_render_text_with_espeak(small_avatar, tmp_path: Path) -> None:
    out = tmp_path / "text.mp4"
    res = _run(
        "render", "--avatar", small_avatar.name, "--avatars-dir", str(small_avatar.path.parent),
        "--text", "Hello there.", "--voice", "espeak", "-o", str(out), "--no-progress",
    )
    assert res.returncode == 0, res.stderr
    assert int(_probe(out)["video"]["nb_read_frames"]) > 10


def test_silent_audio_renders_the_idle_presenter(small_avatar, tmp_path: Path) -> None:
    import av

    wav = _write_wav(tmp_path / "silence.wav", np.zeros(SAMPLE_RATE, dtype=np.float32))
    out = tmp_path / "idle.mp4"
    res = _run(
        "render", "--avatar", small_avatar.name, "--avatars-dir", str(small_avatar.path.parent),
        "--audio", str(wav), "-o", str(out), "--no-progress",
    )
    assert res.returncode == 0, res.stderr
    assert "silent" in res.stdout
    with av.open(str(out)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    assert len(frames) == 25
    for k in (0, 12):
        base = np.asarray(small_avatar.frames[small_avatar.base_frame_index(k)]).astype(np.int16)
        assert np.abs(frames[k].astype(np.int16) - base).mean() < 4.0  # only codec loss


@pytest.mark.parametrize(
    "case",
    ["empty", "unreadable", "unknown_avatar", "no_speakable_text", "unwritable"],
)
def test_bad_input_gives_one_line_error_and_no_output(small_avatar, tmp_path: Path, case: str) -> None:
    out = tmp_path / "out.mp4"
    args = ["render", "--avatar", small_avatar.name, "--avatars-dir", str(small_avatar.path.parent)]
    if case == "empty":
        args += ["--audio", str(_write_wav(tmp_path / "empty.wav", np.zeros(0, np.float32)))]
    elif case == "unreadable":
        bad = tmp_path / "noise.wav"
        bad.write_bytes(b"this is not audio at all" * 10)
        args += ["--audio", str(bad)]
    elif case == "unknown_avatar":
        args = ["render", "--avatar", "nobody", "--avatars-dir", str(small_avatar.path.parent)]
        args += ["--text", "Hi."]
    elif case == "no_speakable_text":
        args += ["--text", " ... !? "]
    elif case == "unwritable":
        out = tmp_path / "missing-folder" / "out.mp4"
        args += ["--text", "Hi."]
    res = _run(*args, "-o", str(out), "--no-progress")
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, res.stderr
    assert not out.exists()
    assert not [p for p in out.parent.glob("*.mp4*")] if out.parent.exists() else True

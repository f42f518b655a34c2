"""`lipstream client` against a real server: the MP4 it records has the frames and audio it received."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import av
import pytest
import server_harness as harness
from server_harness import REPO, ServerProcess

from lipstream.audio.decode import load_audio

pytestmark = pytest.mark.slow
avatars_root = harness.avatars_root  # shared fixtures
live_server = harness.live_server


def run_client(*args: str) -> subprocess.CompletedProcess:
    """The CLI in a subprocess, as a user would run it."""
    return subprocess.run(
        [sys.executable, "-m", "lipstream", "client", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_client_records_uploaded_audio_to_mp4(live_server: ServerProcess, tmp_path: Path) -> None:
    wav = tmp_path / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), "Recording what the server sends."], check=True)
    out, report_path = tmp_path / "got.mp4", tmp_path / "report.json"
    done = run_client(
        "--url", f"ws://127.0.0.1:{live_server.port}", "--avatar", "small",
        "--audio", str(wav), "--out", str(out), "--report", str(report_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(report_path.read_text())
    expected_speech = math.ceil(len(load_audio(wav)) / 640)
    assert report["speech_frames"] == expected_speech
    assert report["pts_continuous"] and report["audio_matches_video"] and report["pts_gaps"] == 0
    assert report["keyframes"] >= 1 and report["ttff_ms"] is not None
    assert [e["message"]["type"] for e in report["events"]] == ["speech_started", "playback_finished"]
    frames = report["frames_received"]
    assert frames >= expected_speech
    with av.open(str(out)) as mp4:
        video, audio = mp4.streams.video[0], mp4.streams.audio[0]
        assert (video.codec_context.width, video.codec_context.height) == (360, 640)
        decoded = sum(1 for _ in mp4.decode(video=0))
        assert decoded == frames
        assert abs(float(video.duration * video.time_base) - frames / 25) < 0.05
        assert abs(float(audio.duration * audio.time_base) - frames / 25) < 0.1


def test_client_text_and_half_size_stream(live_server: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "half.mp4"
    done = run_client(
        "--url",
        live_server.ws,
        "--avatar",
        "second",
        "--text",
        "Half size.",
        "--width",
        "180",
        "--out",
        str(out),
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["speech_frames"] > 5 and summary["pts_continuous"]
    with av.open(str(out)) as mp4:
        ctx = mp4.streams.video[0].codec_context
        assert (ctx.width, ctx.height) == (180, 320)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--avatar", "nobody", "--text", "hi"], "unknown avatar 'nobody'"),
        (["--avatar", "small", "--audio", "/no/such.wav"], "audio file /no/such.wav does not exist"),
    ],
)
def test_client_bad_input_is_one_line(live_server: ServerProcess, tmp_path: Path, args, fragment) -> None:
    done = run_client("--url", live_server.ws, *args, "--out", str(tmp_path / "x.mp4"))
    assert done.returncode == 2
    assert fragment in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x.mp4").exists()


def test_client_cannot_connect_is_one_line(tmp_path: Path) -> None:
    done = run_client(
        "--url", "ws://127.0.0.1:9", "--avatar", "a", "--text", "hi", "--out", str(tmp_path / "x.mp4")
    )
    assert done.returncode == 2 and "cannot connect to ws://127.0.0.1:9/ws" in done.stderr

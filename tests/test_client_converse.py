"""`lipstream client --converse` (issue 9): the real CLI asks a real `lipstream serve --agent` process a
spoken question in real time, records the avatar's answer to MP4 and reports transcripts, reply and turn
metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import pytest
import server_harness as harness
from server_harness import REPO, FakeLLMProcess, ServerProcess, write_speech_wav

pytestmark = pytest.mark.slow
avatars_root = harness.avatars_root  # shared fixtures
live_server = harness.live_server

REPLY = "The museum opens at nine in the morning. It closes at six, except on Mondays."


@pytest.fixture(scope="module")
def fake_llm() -> Iterator[str]:
    """tests/fake_llm_server.py as a process: its URL."""
    llm = FakeLLMProcess("--text", REPLY)
    yield llm.url
    llm.stop()


@pytest.fixture(scope="module")
def agent_server(avatars_root: Path, fake_llm: str) -> Iterator[ServerProcess]:
    """A real server with the agent on, answering with the fake language model."""
    proc = ServerProcess(avatars_root, "--agent", "--llm-url", fake_llm)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A spoken question in the bundled Piper voice, with the room's silence around it."""
    from lipstream.talk.voices.tts import create_tts

    speech = create_tts("piper").synthesize("When does the museum open on Sunday?").pcm
    pcm = np.concatenate([np.zeros(8000, np.float32), speech, np.zeros(3200, np.float32)])
    return write_speech_wav(tmp_path_factory.mktemp("question") / "question.wav", pcm, tail_samples=0)


def client(*args: str) -> subprocess.CompletedProcess:
    """The CLI in a subprocess, as a user would run it."""
    return subprocess.run(
        [sys.executable, "-m", "lipstream", "client", *args],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )  # fmt: skip


def words(text: str) -> set[str]:
    """Lower-case words without punctuation."""
    return {w.strip(".,?!").lower() for w in text.split()}


def test_converse_records_the_answer_and_reports_the_turn(
    agent_server: ServerProcess, question: Path, tmp_path: Path
) -> None:
    out, report_path = tmp_path / "answer.mp4", tmp_path / "report.json"
    done = client(
        "--url", f"ws://127.0.0.1:{agent_server.port}", "--avatar", "small", "--converse", str(question),
        "--out", str(out), "--report", str(report_path),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr + "".join(agent_server.stderr[-20:])
    summary = json.loads(done.stdout)
    report = json.loads(report_path.read_text())
    assert summary["final_transcript"] == report["final_transcript"]
    assert {"museum", "open", "sunday"} <= words(report["final_transcript"])
    finals = [t for t in report["transcripts"] if t["kind"] == "final"]
    assert len(finals) == 1 and all(t["turn"] == 1 for t in report["transcripts"])
    # the first sentence may be cut after its first phrase (quick start), the pieces are the whole reply
    pieces = [r["text"] for r in report["reply_texts"]]
    assert " ".join(pieces) == REPLY and pieces[-1] == "It closes at six, except on Mondays."
    assert report["reply"] == REPLY
    metrics = report["turn_metrics"]
    assert metrics["turn"] == 1 and metrics["interrupted"] is False
    ms = metrics["ms"]
    stages = ("transcript", "llm_first_token", "first_audio", "first_frame")
    assert all(ms[k] is not None and ms[k] > 0 for k in stages)
    assert ms["transcript"] <= ms["llm_first_token"] <= ms["first_audio"] <= ms["first_frame"]
    # the client's own figures: the server's end of speech lies near the WAV's (its VAD adds no more than a
    # window or two), and the frame is shown no earlier than it arrives
    assert abs(report["server_speech_end_samples"] - report["speech_end_samples"]) < 0.2 * 16000
    first = report["speech_end_to_first_frame_ms"]
    assert first is not None and first > 0
    assert report["speech_end_to_first_frame_due_ms"] >= first
    assert 0 < report["end_of_turn_to_first_frame_ms"] < first
    assert report["first_frame_pts"] == report["reply_texts"][0]["position_samples"]
    assert report["interrupted"] is False and report["pts_continuous"] and report["audio_matches_video"]
    assert report["barge_in_ms"] is None  # measured by the browser test
    # the recording: from the question's end (an IDR) through the whole answer, video and audio together
    assert report["speech_frames"] >= 25 and report["frames_recorded"] > report["speech_frames"]
    with av.open(str(out)) as mp4:
        assert mp4.streams.video and mp4.streams.audio
        video, audio = mp4.streams.video[0], mp4.streams.audio[0]
        assert (video.codec_context.width, video.codec_context.height) == (360, 640)
        assert sum(1 for _ in mp4.decode(video=0)) == report["frames_recorded"]
        seconds = report["frames_recorded"] / 25
        assert abs(float(audio.duration * audio.time_base) - seconds) < 0.1
    with av.open(str(out)) as mp4:
        heard = np.concatenate([f.to_ndarray().ravel() for f in mp4.decode(audio=0)])
    assert np.abs(heard).max() > 0.05  # the answer is in the audio track, not silence


def test_converse_refuses_a_server_without_agent_and_bad_questions(
    live_server: ServerProcess, question: Path, tmp_path: Path
) -> None:
    out = tmp_path / "never.mp4"
    url = f"ws://127.0.0.1:{live_server.port}"
    done = client("--url", url, "--avatar", "small", "--converse", str(question), "--out", str(out))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "agent" in lines[0] and "serve --agent" in lines[0], done.stderr
    assert not out.exists()

    garbage = tmp_path / "garbage.wav"
    garbage.write_bytes(b"RIFF not really a wave file" * 10)
    silent = write_speech_wav(tmp_path / "silent.wav", np.zeros(16000, np.float32), tail_samples=0)
    for bad, says in ((garbage, "cannot read the question"), (silent, "holds no speech"),
                      (tmp_path / "missing.wav", "cannot read the question")):  # fmt: skip
        done = client("--url", url, "--avatar", "small", "--converse", str(bad), "--out", str(out))
        assert done.returncode == 2, (bad, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and says in lines[0], done.stderr
    assert not out.exists()

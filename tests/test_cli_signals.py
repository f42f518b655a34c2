"""The CLI under SIGTERM (cleans up like Ctrl-C, exits 143) and `avatar prepare` given a folder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lipstream import cli


def cli_env(home: Path) -> dict[str, str]:
    """The environment a user's shell would give the CLI, with its own LIPSTREAM_HOME."""
    return {**os.environ, "LIPSTREAM_HOME": str(home), "OMP_NUM_THREADS": "1"}


def test_sigterm_unwinds_once_and_restores_the_handler() -> None:
    before = signal.getsignal(signal.SIGTERM)
    cleaned: list[str] = []
    with pytest.raises(cli.Terminated), cli._sigterm_unwinds():
        try:
            signal.raise_signal(signal.SIGTERM)
        finally:
            signal.raise_signal(signal.SIGTERM)  # a second one during cleanup is ignored
            cleaned.append("temp folder")
    assert cleaned == ["temp folder"]
    assert signal.getsignal(signal.SIGTERM) is before


def test_prepare_given_a_folder_says_so(tmp_path: Path) -> None:
    folder = tmp_path / "clips"
    folder.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "lipstream", "avatar", "prepare", str(folder), "--name", "x", "-q"],
        capture_output=True, text=True, env=cli_env(tmp_path / "home"), timeout=120,
    )
    assert done.returncode == 2, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: avatar source {folder} is a folder; pass a video or image file"]


@pytest.mark.slow
def test_sigterm_during_prepare_leaves_nothing(tmp_path: Path) -> None:
    """SIGTERM while frames are being written: exit 143, and no bundle or hidden temp folder remains."""
    from lipstream.avatar.sample import write_sample_video

    clip = tmp_path / "long.mp4"
    write_sample_video(clip, width=360, height=640, seconds=12.0)  # several seconds of prepare work
    home = tmp_path / "home"
    avatars = home / "avatars"
    proc = subprocess.Popen(
        [sys.executable, "-m", "lipstream", "avatar", "prepare", str(clip), "--name", "cut", "-q"],
        env=cli_env(home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            frames = list(avatars.glob(".cut.partial-*/footage.mp4")) if avatars.is_dir() else []
            if frames:
                break
            time.sleep(0.01)
        assert proc.poll() is None, "prepare finished before it could be terminated"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err
    assert "terminated" in err and "Traceback" not in err
    assert list(avatars.iterdir()) == []  # neither .cut.partial-* nor cut

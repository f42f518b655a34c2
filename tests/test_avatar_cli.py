"""`lipstream avatar ...` end to end in a real subprocess: prepare, sample, list, info, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def lipstream(*args: str, home: Path) -> subprocess.CompletedProcess:
    """Run the CLI as a user would, with its own LIPSTREAM_HOME."""
    env = {**os.environ, "LIPSTREAM_HOME": str(home), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "lipstream", *args], capture_output=True, text=True, env=env, timeout=300
    )


def error_lines(stderr: str) -> list[str]:
    """Our own error lines (mediapipe's C++ logging also writes to stderr)."""
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_prepare_list_info(sample_video_path: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture):
    home = tmp_path / "home"
    done = lipstream("avatar", "prepare", str(sample_video_path), "--name", "anchor", "-q", home=home)
    assert done.returncode == 0, done.stderr
    assert "prepared avatar 'anchor': 50 frames (2.0 s at 25 fps), 360×640, face" in done.stdout
    assert (home / "avatars" / "anchor" / "manifest.json").is_file()

    listed = lipstream("avatar", "list", home=home)
    assert listed.returncode == 0 and listed.stdout.startswith("anchor\t50 frames\t360×640")

    info = lipstream("avatar", "info", "anchor", "--json", home=home)
    data = json.loads(info.stdout)
    assert data["frame_count"] == 50 and data["fps"] == 25
    assert data["arrays"]["masks"]["shape"] == [50, 256, 256]
    assert data["arrays"]["idle_loop"]["shape"] == [98]
    shown = lipstream("avatar", "info", "anchor", home=home)
    assert "  blinks   " in shown.stdout and "prepared before blinks" not in shown.stdout

    # a bundle prepared before blinks were drawn says so, and how to add them
    manifest = home / "avatars" / "anchor" / "manifest.json"
    fields = json.loads(manifest.read_text())
    del fields["idle"]["blinks"]
    manifest.write_text(json.dumps(fields))
    old = lipstream("avatar", "info", "anchor", home=home)
    fix = f"`lipstream avatar prepare {sample_video_path.name} --name anchor --force` adds them"
    note = "prepared before blinks were drawn (its idle loop blinks only if the footage does): " + fix
    assert f"  note     {note}" in old.stdout, old.stdout
    from lipstream.server.cli import _warn_of_unblinking_avatars  # what `serve` says when it starts

    with caplog.at_level("WARNING"):
        _warn_of_unblinking_avatars(home / "avatars")
    assert [r.getMessage() for r in caplog.records] == [f"avatar 'anchor': {note}"]

    again = lipstream("avatar", "prepare", str(sample_video_path), "--name", "anchor", home=home)
    assert again.returncode == 2
    assert error_lines(again.stderr) == [
        f"error: avatar 'anchor' already exists at {home / 'avatars' / 'anchor'}; use --force to replace it"
    ]


@pytest.mark.slow
def test_errors_are_one_line_exit_2(tmp_path: Path):
    home = tmp_path / "home"
    missing = lipstream("avatar", "prepare", str(tmp_path / "none.mp4"), "--name", "x", home=home)
    assert missing.returncode == 2 and len(error_lines(missing.stderr)) == 1
    assert "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    unknown = lipstream("avatar", "info", "ghost", home=home)
    assert unknown.returncode == 2 and "unknown avatar 'ghost'" in unknown.stderr


@pytest.mark.slow
def test_sample_then_skip_existing(tmp_path: Path):
    home = tmp_path / "home"
    built = lipstream("avatar", "sample", "--name", "s", "--seconds", "1.2", "-q", home=home)
    assert built.returncode == 0, built.stderr
    assert "built sample avatar 's': 30 frames (1.2 s at 25 fps), 1080×1920" in built.stdout
    kept = lipstream("avatar", "sample", "--name", "s", "--skip-existing", home=home)
    assert kept.returncode == 0 and "already exists (30 frames)" in kept.stdout and "kept" in kept.stdout
    # one built before blinks were drawn is built again (make demo then shows a blinking sample)
    manifest = home / "avatars" / "s" / "manifest.json"
    fields = json.loads(manifest.read_text())
    del fields["idle"]["blinks"]
    manifest.write_text(json.dumps(fields))
    args = ("avatar", "sample", "--name", "s", "--seconds", "1.2", "--skip-existing", "-q")
    rebuilt = lipstream(*args, home=home)
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "was built before blinks were drawn; building it again" in rebuilt.stdout
    assert "blinks" in json.loads(manifest.read_text())["idle"]


@pytest.mark.slow
def test_interrupted_prepare_leaves_nothing(tmp_path: Path):
    """Ctrl-C in the middle of writing frames: exit 130, no bundle and no temp folder remain."""
    import signal
    import time

    from lipstream.avatar.sample import write_sample_video

    clip = tmp_path / "long.mp4"
    write_sample_video(clip, width=1080, height=1920, seconds=4.0)
    home = tmp_path / "home"
    avatars = home / "avatars"
    env = {**os.environ, "LIPSTREAM_HOME": str(home), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lipstream", "avatar", "prepare", str(clip), "--name", "cut", "-q"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # as from a terminal: a suite started in the background (nohup, `&`) passes SIGINT on ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        partial = list(avatars.glob(".cut.partial-*/footage.mp4")) if avatars.is_dir() else []
        if partial and partial[0].stat().st_size > 64 * 1024:  # frames are being encoded
            break
        time.sleep(0.01)
    assert proc.poll() is None, "prepare finished before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert list(avatars.iterdir()) == []


@pytest.mark.slow
def test_a_photo_breathes_and_blinks_unless_asked_not_to(tmp_path: Path):
    import cv2

    from lipstream.avatar.sample import presenter_frame

    home = tmp_path / "home"
    photo = tmp_path / "anchor.png"
    cv2.imwrite(str(photo), cv2.cvtColor(presenter_frame(288, 512), cv2.COLOR_RGB2BGR))
    moving = lipstream("avatar", "prepare", str(photo), "--name", "moving", "-q", home=home)
    assert moving.returncode == 0, moving.stderr
    assert "'moving': photo -> 300 frames (12.0 s at 25 fps)" in moving.stdout
    info = lipstream("avatar", "info", "moving", home=home)
    assert "a photo, played as a 12 s loop with" in info.stdout and "0 of its own" in info.stdout
    still = lipstream("avatar", "prepare", str(photo), "--name", "still", "--still", "--no-blink", home=home)
    assert still.returncode == 0, still.stderr
    assert "'still': photo, 288×512" in still.stdout
    blinking = lipstream("avatar", "prepare", str(photo), "--name", "blinking", "--still", "-q", home=home)
    assert "'blinking': photo -> 4 frames" in blinking.stdout

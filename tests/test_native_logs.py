"""Issue 19: native libraries' INFO/WARNING chatter stays off the terminal; errors and our output do not."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lipstream.native_logs import is_native_noise

REPO = Path(__file__).resolve().parent.parent


def test_absl_info_and_warning_lines_are_noise_errors_are_not() -> None:
    assert is_native_noise(b"W0000 00:00:1733050000.123456   4321 inference_feedback_manager.cc:114] Feed")
    assert is_native_noise(b"I0000 00:00:1733050000.123456   4321 gl_context.cc:357] GL version: 3.2")
    assert is_native_noise(
        b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
    )
    assert is_native_noise(b"INFO: Created TensorFlow Lite XNNPACK delegate for CPU.")
    assert not is_native_noise(b"E0000 00:00:1733050000.123456   4321 graph.cc:10] Graph failed")
    assert not is_native_noise(b"error: no face found in anchor.mp4")
    assert not is_native_noise(b"Warning: the avatar is small")


def run_python(code: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter; its output as text, carriage returns kept."""
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True,
                          timeout=120)  # fmt: skip
    done.stdout, done.stderr = done.stdout.decode(), done.stderr.decode()
    return done


def test_the_filter_drops_native_lines_and_passes_the_rest_through_in_order() -> None:
    done = run_python(
        """
        import os, sys
        from lipstream.native_logs import quiet_native_logs
        with quiet_native_logs():
            os.write(2, b"W0000 00:00:1.5   7 feedback.cc:114] Feedback manager requires a model\\n")
            os.write(2, b"progress 50%\\r")
            print("a python warning", file=sys.stderr)
            os.write(2, b"E0000 00:00:1.5   7 graph.cc:9] a native error\\n")
            os.write(2, b"I0000 00:00:1.5   7 gl.cc:1] chatter")  # no newline, then the context ends
        print("after", file=sys.stderr)
        """
    )
    assert done.returncode == 0, done.stderr
    native_error = "E0000 00:00:1.5   7 graph.cc:9] a native error\n"
    assert done.stderr == "progress 50%\ra python warning\n" + native_error + "after\n"


@pytest.mark.slow
def test_face_tracking_prints_no_native_log_lines() -> None:
    """The real mediapipe face mesh on the sample image: quiet inside the filter, chatty without it (so
    this test can tell)."""
    track = """
        from skimage import data
        from lipstream.avatar.tracking import FaceTracker
        with FaceTracker() as tracker:
            for _ in range(3):
                assert tracker.track(data.astronaut()) is not None
        """
    loud = run_python(track)
    assert loud.returncode == 0, loud.stderr
    quiet = run_python(
        "from lipstream.native_logs import quiet_native_logs\nwith quiet_native_logs():\n"
        + textwrap.indent(textwrap.dedent(track), "    ")
    )
    assert quiet.returncode == 0, quiet.stderr
    noisy_lines = [line for line in loud.stderr.splitlines() if is_native_noise(line.encode())]
    assert noisy_lines, "mediapipe printed nothing to filter here"
    assert not [line for line in quiet.stderr.splitlines() if line.strip()], quiet.stderr

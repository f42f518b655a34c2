"""Native libraries' chatter kept off the terminal: absl/glog INFO and WARNING lines and TFLite notices.

mediapipe's graphs log through absl straight to file descriptor 2 (C++, no Python logger to configure), one
`W0000 … inference_feedback_manager.cc:114] Feedback manager requires …` pair per frame batch, which buried a
long prepare's progress (issue 19). While `quiet_native_logs()` is active, fd 2 is a pipe read by a thread
that drops those lines and passes everything else through at once (errors, Python tracebacks, warnings of
our own). Python's logging and rich's progress bars (stdout) are not touched.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import os
import re
import select
import sys
import threading
from collections.abc import Iterator

# absl/glog: a severity letter (I, W) and MMDD, time, thread, file:line] — errors (E, F) still show
_NATIVE_NOISE = re.compile(
    rb"^(?:[IW]\d{4} \d+:\d+:[\d.]+\s+\d+ [\w.+/-]+:\d+\]"
    rb"|WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|INFO: Created TensorFlow Lite XNNPACK delegate for CPU\.)"
)
# a partial line that may still become a noise line: held until its end arrives (briefly)
_MAYBE_NOISE = re.compile(rb"^(?:[IW]\d{0,4}(?: [\d:. ]*(?:\d+ [\w.+/-]*(?::\d*)?)?)?|WARNING: All|INFO: C)")
_HOLD_SECONDS = 0.2
NATIVE_LOG_ENV = {"GLOG_minloglevel": "2", "TF_CPP_MIN_LOG_LEVEL": "2"}  # read by glog/TensorFlow at load


def quiet_env() -> None:
    """Ask glog/TensorFlow-style libraries loaded later for warnings and errors only (user settings win)."""
    for name, value in NATIVE_LOG_ENV.items():
        os.environ.setdefault(name, value)


def is_native_noise(line: bytes) -> bool:
    """Whether one stderr line is native INFO/WARNING chatter."""
    return bool(_NATIVE_NOISE.match(line.lstrip(b"\r")))


def _forward(read_fd: int, write_fd: int) -> None:
    with contextlib.suppress(OSError):  # the read end closed under us: the context ended
        _forward_lines(read_fd, write_fd)


def _forward_lines(read_fd: int, write_fd: int) -> None:
    pending = b""
    while True:
        ready, _, _ = select.select([read_fd], [], [], _HOLD_SECONDS)
        chunk = os.read(read_fd, 65536) if ready else b""
        if ready and not chunk:  # every writer closed: flush what is left and stop
            if pending and not is_native_noise(pending):
                os.write(write_fd, pending)
            return
        pending += chunk
        *lines, pending = pending.split(b"\n")
        out = b"".join(line + b"\n" for line in lines if not is_native_noise(line))
        if pending and (not ready or not _MAYBE_NOISE.match(pending.lstrip(b"\r"))):
            out += pending  # a prompt or a progress line without its newline yet: show it now
            pending = b""
        if out:
            os.write(write_fd, out)


@contextlib.contextmanager
def quiet_native_logs(fd: int = 2) -> Iterator[None]:
    """While inside, native INFO/WARNING log lines written to `fd` are dropped; the rest passes through."""
    quiet_env()
    with contextlib.suppress(ValueError, OSError):
        sys.stderr.flush()
    saved = os.dup(fd)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, fd)
    os.close(write_fd)
    crash_report = None
    if faulthandler.is_enabled():  # a crash's traceback must reach the terminal, not die in the pipe
        crash_report = os.fdopen(os.dup(saved), "w")
        faulthandler.enable(file=crash_report)
    forwarder = threading.Thread(target=_forward, args=(read_fd, saved), name="native-logs", daemon=True)
    forwarder.start()
    try:
        yield
    finally:
        with contextlib.suppress(ValueError, OSError):
            sys.stderr.flush()
        os.dup2(saved, fd)  # the pipe's last writer (unless a child process kept it) is gone: EOF
        forwarder.join(timeout=1.0)
        os.close(read_fd)
        os.close(saved)
        if crash_report is not None:
            _restore_faulthandler()
            crash_report.close()


def _restore_faulthandler() -> None:
    """Point faulthandler back at stderr (the real fd 2 when sys.stderr is a capture without one)."""
    try:
        faulthandler.enable()
    except (io.UnsupportedOperation, ValueError, AttributeError, OSError):
        faulthandler.enable(file=sys.__stderr__)

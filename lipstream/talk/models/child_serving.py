"""The child's side of a supervised model process (lipstream.talk.models.model_process): it dies with its
parent,
answers only the holder of the per-start key, and announces readiness with one JSON line on stdout once it
listens on 127.0.0.1."""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import hmac
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from lipstream.talk.models.model_process import KEY_ENV

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """End this process when `parent_pid` ends, however it ends (SIGKILL included)."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent was already gone before prctl took effect
        os._exit(0)

    def watch() -> None:  # where prctl does not exist; harmless where it does
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def start_child(parent_pid: int) -> str | None:
    """A child's first steps: die with `parent_pid`, leave a native crash's Python stack on stderr (which
    the supervisor keeps), read the per-start key from the environment (never argv). The key, or None
    (said on stderr) when it is missing or too short."""
    die_with_parent(parent_pid)
    faulthandler.enable()
    key = os.environ.get(KEY_ENV, "")
    if len(key) < 16:
        print(f"error: set {KEY_ENV} (16 characters at least)", file=sys.stderr)
        return None
    return key


def authorized(request: Any, key: str) -> bool:
    """The request's `Authorization` header carries the key (compared in constant time)."""
    header = request.headers.get("authorization", "")
    return hmac.compare_digest(header.encode(), f"Bearer {key}".encode())


def serve_ready(app: Any, ready: dict[str, Any]) -> None:
    """Bind 127.0.0.1 on a free port, print the ready line (`ready` with the port and pid), serve `app` (an
    ASGI app) until the process is killed."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    print(json.dumps({"ready": True, "port": sock.getsockname()[1], "pid": os.getpid(), **ready}), flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False))
    server.run(sockets=[sock])


def run_child(parent_pid: int, load: Callable[[str], tuple[Any, dict[str, Any]]]) -> int:
    """A child's whole life: start (`start_child`), `load(key)` its model into an app and the ready line's
    fields (a LipstreamError is said on stderr: exit code 2), then serve until killed."""
    from lipstream.errors import LipstreamError

    key = start_child(parent_pid)
    if key is None:
        return 2
    try:
        app, ready = load(key)
    except LipstreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    serve_ready(app, ready)
    return 0

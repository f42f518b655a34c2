"""The child's side of a supervised model process (lipstream.talk.model_process): it dies with its parent,
answers only the holder of the per-start key, and announces readiness with one JSON line on stdout once it
listens on 127.0.0.1."""

from __future__ import annotations

import contextlib
import ctypes
import hmac
import json
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from lipstream.talk.model_process import KEY_ENV

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


def child_key() -> str | None:
    """The per-start key from the environment (never on argv), or None when it is missing or too short."""
    key = os.environ.get(KEY_ENV, "")
    return key if len(key) >= 16 else None


def authorized(header: str, key: str) -> bool:
    """An `Authorization` header carries the key (compared in constant time)."""
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

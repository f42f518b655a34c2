"""A native model in a supervised child process: started, watched, restarted with backoff, stopped.

A crash, hang or out-of-memory of a native library (llama.cpp on a CPU it was not built for, issue 19) ends
the child, never the process that serves users. The child announces readiness with one JSON line on stdout
(`{"ready": true, "port": N, ...}`) once its model is loaded and warm, and serves 127.0.0.1:N for whoever
holds the per-start key passed in its environment. It is started from the supervisor's own long-lived thread,
because Linux's parent-death signal follows the thread that started a child, not the process.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import selectors
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import IO, Any

from lipstream.talk.models.native_choices import child_env

log = logging.getLogger(__name__)

KEY_ENV = "LIPSTREAM_MODEL_KEY"  # lipstream.talk.models.llm_child reads it
STDERR_TAIL_LINES = 30


class ProcessState(str, Enum):
    """Where a supervised child is in its life."""

    STARTING = "starting"
    UP = "up"
    RESTARTING = "restarting"
    FAILED = "failed"  # gave up after too many starts that never got ready
    STOPPED = "stopped"


@dataclass(frozen=True)
class RestartPolicy:
    """How a child that died is started again."""

    max_failed_starts: int = 5  # consecutive starts that never got ready, then FAILED
    first_backoff_seconds: float = 0.25  # doubles with each consecutive failed start
    max_backoff_seconds: float = 8.0
    ready_timeout_seconds: float = 90.0  # load + warm-up on a busy 2-core machine
    stop_grace_seconds: float = 3.0  # SIGTERM, then SIGKILL

    def backoff(self, failed_starts: int) -> float:
        """Seconds to wait before the next start after `failed_starts` consecutive failed starts."""
        return min(self.max_backoff_seconds, self.first_backoff_seconds * 2 ** max(0, failed_starts - 1))


# A model child's numpy needs no BLAS thread pool: its model runs on its own native threads. OpenBLAS's pool
# spins after each call: the recogniser's log-mel matmul left a thread burning ~100 ms of CPU per decode,
# taken from the final decode and the frames on a 2-core machine (issue 35).
QUIET_BLAS = {"OPENBLAS_NUM_THREADS": "1"}


@dataclass(frozen=True)
class ChildCommand:
    """What to run: argv (without --parent-pid, which the supervisor adds) and a name for messages."""

    argv: Sequence[str]
    label: str
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Endpoint:
    """A ready child: where it listens and the key it wants."""

    port: int
    key: str
    pid: int
    generation: int  # 1 for the first child, +1 per start
    ready: dict[str, Any]  # the child's ready line (load and warm-up seconds)

    @property
    def url(self) -> str:
        """Its base URL."""
        return f"http://127.0.0.1:{self.port}"


@dataclass(frozen=True)
class ProcessStatus:
    """A snapshot for /healthz, /metrics and `doctor`."""

    label: str
    state: ProcessState
    restarts: int
    pid: int | None
    last_exit: str | None  # how the previous child ended ("killed by SIGSEGV", "exit code 2: ...")

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly."""
        return {"name": self.label, "state": self.state.value, "restarts": self.restarts, "pid": self.pid,
                "last_exit": self.last_exit}  # fmt: skip


def describe_exit(returncode: int | None, stderr_tail: Sequence[str] = ()) -> str:
    """One line on how a child ended."""
    if returncode is None:
        return "still running"
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
        return f"killed by signal {-returncode}"
    last = next((line.strip() for line in reversed(stderr_tail) if line.strip()), "")
    return f"exit code {returncode}" + (f": {last[:200]}" if last else "")


class SupervisedProcess:
    """Keeps one child running: starts it, waits for its ready line, restarts it when it dies.

    `start()` returns at once; `wait_ready()` blocks until the child is up (its Endpoint) or the supervisor
    gave up (None). A child that reached ready and died later is restarted after the first backoff;
    consecutive starts that never get ready back off exponentially, and after `max_failed_starts` the state
    is FAILED for good. `stop()` ends the child (SIGTERM, then SIGKILL) and the supervisor.
    """

    def __init__(self, command: ChildCommand, policy: RestartPolicy | None = None) -> None:
        self.command = command
        self.policy = policy or RestartPolicy()
        self._cond = threading.Condition()
        self._state = ProcessState.STARTING
        self._endpoint: Endpoint | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._restarts = 0
        self._generation = 0
        self._last_exit: str | None = None
        self._stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- the owner's side ----

    def start(self) -> None:
        """Start supervising (the first child starts in the background)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._supervise, name="model-supervisor", daemon=True)
        self._thread.start()

    def wait_ready(self, timeout: float) -> Endpoint | None:
        """The ready child's endpoint, waiting up to `timeout` s for a (re)starting one; None when there is
        none (at once when the supervisor has given up or been stopped)."""
        with self._cond:
            self._cond.wait_for(self._settled, timeout)
            return self._endpoint if self._state is ProcessState.UP and self._child_alive() else None

    def _child_alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _settled(self) -> bool:
        """Up with a living child (one that just died is not up, whatever the state says yet), or over."""
        if self._state is ProcessState.UP:
            return self._child_alive()
        return self._state in (ProcessState.FAILED, ProcessState.STOPPED)

    def status(self) -> ProcessStatus:
        """State, restart count, current pid and how the last child ended."""
        with self._cond:
            pid = self._proc.pid if self._child_alive() else None
            return ProcessStatus(self.command.label, self._state, self._restarts, pid, self._last_exit)

    def failure(self) -> str:
        """Why no child is ready: how the last one ended (or the state), with the children's last stderr
        lines."""
        status = self.status()
        tail = " | ".join(line for line in self.stderr_tail()[-3:] if line)
        return f"{status.last_exit or status.state.value}{f' ({tail})' if tail else ''}"

    def stderr_tail(self) -> list[str]:
        """The last lines the children wrote to stderr (a crash's traceback, a load error)."""
        with self._cond:
            return list(self._stderr_tail)

    def has_exited(self, endpoint: Endpoint, wait_seconds: float = 0.0) -> bool:
        """Whether the child behind `endpoint` has ended (waiting up to `wait_seconds` for it to)."""
        deadline = time.monotonic() + wait_seconds
        while True:
            with self._cond:
                proc = self._proc
                if self._generation != endpoint.generation or proc is None or proc.poll() is not None:
                    return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)

    def exit_of(self, endpoint: Endpoint) -> str:
        """How the child behind `endpoint` ended ("killed by SIGSEGV"), or "still running"."""
        with self._cond:
            if self._generation != endpoint.generation:
                return self._last_exit or "it ended"
            returncode = self._proc.poll() if self._proc is not None else None
            return describe_exit(returncode, list(self._stderr_tail))

    def kill(self, endpoint: Endpoint, reason: str) -> None:
        """Kill the child behind `endpoint` (hung: it stopped answering); the supervisor restarts it."""
        with self._cond:
            proc = self._proc
            if proc is None or self._generation != endpoint.generation or proc.poll() is not None:
                return
        log.warning("%s: killing pid %d (%s)", self.command.label, proc.pid, reason)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()

    def stop(self) -> None:
        """End the child and the supervisor; idempotent."""
        self._stopping.set()
        with self._cond:
            proc = self._proc
        if proc is not None:
            _terminate(proc, self.policy.stop_grace_seconds)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.policy.stop_grace_seconds + 2)
        self._set_state(ProcessState.STOPPED, None)

    # ---- the supervisor thread ----

    def _set_state(self, state: ProcessState, endpoint: Endpoint | None) -> None:
        with self._cond:
            if self._state is ProcessState.STOPPED:
                return
            self._state = state
            self._endpoint = endpoint
            self._cond.notify_all()

    def _supervise(self) -> None:
        failed_starts = 0
        while not self._stopping.is_set():
            proc, key = self._spawn()
            ready = self._read_ready(proc)
            if ready is not None:
                failed_starts = 0
                endpoint = Endpoint(int(ready["port"]), key, proc.pid, self._generation, ready)
                self._set_state(ProcessState.UP, endpoint)
                log.info("%s up (pid %d, port %d)", self.command.label, proc.pid, endpoint.port)
                while proc.poll() is None and not self._stopping.wait(0.05):
                    pass
            else:
                failed_starts += 1
                _terminate(proc, 0.5)
            if self._stopping.is_set():
                break
            proc.wait()
            time.sleep(0.05)  # let the stderr reader take the child's last lines (a crash's traceback)
            with self._cond:
                self._last_exit = describe_exit(proc.returncode, list(self._stderr_tail))
            if failed_starts >= self.policy.max_failed_starts:
                log.error("%s failed %d starts in a row (%s); giving up", self.command.label, failed_starts,
                          self._last_exit)  # fmt: skip
                self._set_state(ProcessState.FAILED, None)
                return
            with self._cond:
                self._restarts += 1
            self._set_state(ProcessState.RESTARTING, None)
            backoff = self.policy.backoff(max(1, failed_starts))
            log.warning("%s ended (%s); restarting in %.2f s", self.command.label, self._last_exit, backoff)
            self._stopping.wait(backoff)

    def _spawn(self) -> tuple[subprocess.Popen[bytes], str]:
        key = secrets.token_urlsafe(32)
        # child_env(): the native libraries' settings for this CPU (native_choices.py), at each start
        env = {**os.environ, **QUIET_BLAS, **child_env(), **self.command.env, KEY_ENV: key}
        argv = [*self.command.argv, "--parent-pid", str(os.getpid())]
        pipe = subprocess.PIPE
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe, env=env)
        with self._cond:
            self._proc = proc
            self._generation += 1
        assert proc.stderr is not None
        threading.Thread(target=self._drain, args=(proc.stderr,), name="model-stderr", daemon=True).start()
        return proc, key

    def _drain(self, stream: IO[bytes]) -> None:
        for raw in iter(stream.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip()
            with self._cond:
                self._stderr_tail.append(line)
            log.debug("%s: %s", self.command.label, line)
        stream.close()

    def _read_ready(self, proc: subprocess.Popen[bytes]) -> dict[str, Any] | None:
        """The child's ready line, or None when it exits, prints something else or takes too long."""
        assert proc.stdout is not None
        deadline = time.monotonic() + self.policy.ready_timeout_seconds
        buffer = b""
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stdout, selectors.EVENT_READ)
            while b"\n" not in buffer:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopping.is_set():
                    log.warning("%s: no ready line after %.0f s", self.command.label,
                                self.policy.ready_timeout_seconds)  # fmt: skip
                    return None
                if not selector.select(timeout=min(left, 0.1)):
                    continue
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:  # the child closed stdout: it ended before it was ready
                    return None
                buffer += chunk
        threading.Thread(target=self._drain, args=(proc.stdout,), name="model-stdout", daemon=True).start()
        try:
            ready = json.loads(buffer.split(b"\n", 1)[0])
        except ValueError:
            return None
        return ready if isinstance(ready, dict) and ready.get("ready") and "port" in ready else None


def _terminate(proc: subprocess.Popen[bytes], grace_seconds: float) -> None:
    """SIGTERM, then SIGKILL after `grace_seconds`; reaps it."""
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        proc.terminate()
    try:
        proc.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()

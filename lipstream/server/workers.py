"""`serve --workers N`: one listening socket, N worker processes serving on it, and this supervisor.

The supervisor binds the socket and hands it to each worker (lipstream.server.worker), so the kernel gives
each new connection to whichever worker accepts first, and a WebSocket session stays in the worker that
accepted it. Each worker loads its own engine and reads avatars from their bundles on disk: nothing is
copied between processes. The supervisor restarts a worker that dies, stops them all on Ctrl-C or SIGTERM,
and removes the server's private folder (shared counts, snapshot sockets); a worker dies with it even when
it is killed outright (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lipstream.errors import LipstreamError
from lipstream.server.config import ServerConfig
from lipstream.server.launch import serving_line
from lipstream.server.tally import SharedTally
from lipstream.server.worker import WorkerSpec, connections_tally_path, sessions_tally_path

log = logging.getLogger(__name__)

STOP_GRACE_S = 8.0  # workers close their sessions within this, else they are killed
QUICK_DEATH_S = 10.0  # a worker that dies sooner than this after its start is restarted after a pause
MAX_BACKOFF_S = 30.0


def listen_socket(host: str, port: int) -> socket.socket:
    """A bound, listening socket the workers inherit (port 0: a free one)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = f"{exc.strerror}; in use? try --port 0"
        raise LipstreamError(f"could not listen on {host}:{port} ({reason})") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


@dataclass
class _Worker:
    """One worker's process and what the supervisor tracks about it."""

    index: int
    proc: subprocess.Popen
    ready_fd: int  # read end of its ready pipe; -1 once it said ready (or closed)
    pid_fd: int  # readable once the process has ended (pidfd): the supervisor sleeps in select(), no polling
    started_at: float
    ready: bool = False

    def close_fds(self) -> None:
        """Close the pipe and the pidfd (idempotent)."""
        for name in ("ready_fd", "pid_fd"):
            if getattr(self, name) >= 0:
                os.close(getattr(self, name))
                setattr(self, name, -1)


class Supervisor:
    """Starts, watches, restarts and stops the workers of one server."""

    def __init__(self, config: ServerConfig, engine_options: dict[str, Any], workers: int,
                 sock: socket.socket, folder: Path) -> None:  # fmt: skip
        self.config = config
        self.engine_options = engine_options
        self.count = workers
        self.sock = sock
        self.folder = folder
        self.restarts = 0
        self._workers: dict[int, _Worker] = {}
        self._quick_deaths: dict[int, int] = {}
        self._tallies = [
            SharedTally(sessions_tally_path(folder), workers, 0),
            SharedTally(connections_tally_path(folder), workers, 0),
        ]

    def pids(self) -> list[int]:
        """The live workers' process ids."""
        return [w.proc.pid for w in self._workers.values() if w.proc.poll() is None]

    def _spawn(self, index: int) -> _Worker:
        read_fd, write_fd = os.pipe()
        spec = WorkerSpec(
            config=self.config, engine_options=self.engine_options, index=index, workers=self.count,
            folder=self.folder, listen_fd=self.sock.fileno(), ready_fd=write_fd, parent_pid=os.getpid(),
            log_level=logging.getLogger().getEffectiveLevel(),
        )  # fmt: skip
        try:
            # its own process group: Ctrl-C reaches the supervisor only, which stops the workers in order
            proc = subprocess.Popen(
                [sys.executable, "-m", "lipstream.server.worker"], stdin=subprocess.PIPE,
                pass_fds=(self.sock.fileno(), write_fd), process_group=0,
            )  # fmt: skip
        finally:
            os.close(write_fd)
        assert proc.stdin is not None
        proc.stdin.write(spec.model_dump_json().encode())
        proc.stdin.close()
        pid_fd = os.pidfd_open(proc.pid)
        worker = _Worker(index=index, proc=proc, ready_fd=read_fd, pid_fd=pid_fd, started_at=time.monotonic())
        self._workers[index] = worker
        return worker

    def _wait_events(self) -> tuple[list[_Worker], list[_Worker]]:
        """Block until a worker says it is ready or ends; (newly ready, ended)."""
        watched = {w.pid_fd: w for w in self._workers.values()}
        watched.update({w.ready_fd: w for w in self._workers.values() if w.ready_fd >= 0})
        readable, _, _ = select.select(list(watched), [], [])
        ready, ended = [], []
        for fd in readable:
            worker = watched[fd]
            if fd == worker.ready_fd:
                worker.ready = os.read(fd, 1) == b"r"  # b"": it closed the pipe without being ready
                os.close(fd)
                worker.ready_fd = -1
                if worker.ready:
                    ready.append(worker)
            elif worker.proc.poll() is not None:
                ended.append(worker)
        return ready, ended

    def start(self) -> None:
        """Start every worker and wait until all accept connections; one that fails to start is an error."""
        for index in range(self.count):
            self._spawn(index)
        while not all(w.ready for w in self._workers.values()):
            _, ended = self._wait_events()
            for worker in ended:
                if not worker.ready:
                    raise LipstreamError(
                        f"worker {worker.index} exited with {_exit_text(worker.proc.returncode)} before it "
                        "was ready (its messages are above)"
                    )
                self._replace(worker)

    def watch(self) -> None:
        """Restart workers that die, for ever (until Ctrl-C or SIGTERM interrupts)."""
        while True:
            ready, ended = self._wait_events()
            for worker in ready:  # every first worker was ready before this: these are replacements
                log.warning("worker %d (pid %d) is serving again", worker.index, worker.proc.pid)
            for worker in ended:
                self._replace(worker)

    def _replace(self, dead: _Worker) -> None:
        dead.close_fds()
        for tally in self._tallies:  # its sessions and connections died with it
            tally.clear_cell(dead.index)
        lived = time.monotonic() - dead.started_at
        quick = self._quick_deaths.get(dead.index, 0) + 1 if lived < QUICK_DEATH_S else 0
        self._quick_deaths[dead.index] = quick
        pause = min(MAX_BACKOFF_S, 2.0 ** (quick - 1)) if quick else 0.0
        log.warning(
            "worker %d (pid %d) exited with %s after %.0f s; starting a new one%s", dead.index, dead.proc.pid,
            _exit_text(dead.proc.returncode), lived, f" in {pause:.0f} s" if pause else "",
        )  # fmt: skip
        if pause:
            time.sleep(pause)
        self.restarts += 1
        self._spawn(dead.index)

    def stop(self) -> None:
        """SIGTERM every worker, wait for them to close their sessions, kill those that do not."""
        live = [w for w in self._workers.values() if w.proc.poll() is None]
        for worker in live:
            _signal(worker.proc, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for worker in live:
            try:
                worker.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %d did not stop in %.0f s; killing it", worker.index, STOP_GRACE_S)
                _signal(worker.proc, signal.SIGKILL)
                worker.proc.wait()
        for worker in self._workers.values():
            worker.close_fds()
        for tally in self._tallies:
            tally.close()


def _signal(proc: subprocess.Popen, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass  # it ended in between


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"code {code}"


def run_workers(config: ServerConfig, engine_options: dict[str, Any], workers: int) -> int:
    """Serve with `workers` processes on one socket until interrupted; print the URL once all are ready."""
    sock = listen_socket(config.host, config.port)
    folder = Path(tempfile.mkdtemp(prefix="lipstream-serve-"))  # mode 0700: this user's workers only
    supervisor = Supervisor(config, engine_options, workers, sock, folder)
    try:
        supervisor.start()
        print(serving_line(config, sock.getsockname()[1]), flush=True)
        log.info("%d workers: pids %s", workers, supervisor.pids())
        supervisor.watch()
    finally:
        # SIGTERM again while the workers stop must not cut their cleanup short (Ctrl-C's path is the same)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        supervisor.stop()
        sock.close()
        shutil.rmtree(folder, ignore_errors=True)
    return 0

"""Shared by the live tests: an avatars folder with two avatars and a real `lipstream serve` process."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import websockets

REPO = Path(__file__).resolve().parent.parent
URL_LINE = re.compile(r"serving at (http://[\d.]+:(\d+))")


async def close_code_when_dropped(ws, timeout: float = 30.0) -> int:
    """Read whatever the server sends until it drops the socket; its close code (1006: none came).
    Raises TimeoutError when the socket stays silent and open for `timeout` seconds."""
    try:
        while True:
            await asyncio.wait_for(ws.recv(), timeout)
    except websockets.ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd is not None else 1006


def copy_avatar(src: Path, root: Path, name: str) -> Path:
    """Copy a bundle under a new name (manifest name edited), as a second avatar would be."""
    dst = root / name
    shutil.copytree(src, dst)
    manifest = json.loads((dst / "manifest.json").read_text())
    manifest["name"] = name
    (dst / "manifest.json").write_text(json.dumps(manifest))
    return dst


def process_tree(pid: int) -> list[int]:
    """`pid` and every process below it (a server's worker processes), as long as they live."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            try:
                todo.extend(int(child) for child in task.read_text().split())
            except OSError:
                continue  # the thread ended meanwhile
    return found


def status_kib(pid: int, field: str) -> int:
    """One kB figure of /proc/PID/status (0 when the process is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    match = re.search(rf"{field}:\s+(\d+)", status)
    return int(match.group(1)) if match else 0


class ServerProcess:
    """`lipstream serve` in a subprocess on a free port; stderr is kept for failure messages."""

    def __init__(
        self, avatars_dir: Path, *extra: str, env: dict[str, str] | None = None, python: str = sys.executable,
        start_timeout: float = 60.0, verbose: bool = False,
    ) -> None:
        """`python`: the interpreter to run it with (default: this one); `verbose`: INFO logs in stderr."""
        cmd = [
            python,
            "-m",
            "lipstream",
            *(["--verbose"] if verbose else []),
            "serve",
            "--port",
            "0",
            "--avatars-dir",
            str(avatars_dir),
            *extra,
        ]
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        self.stderr: list[str] = []
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self.http, self.port = self._wait_for_url(timeout=start_timeout)
        self.ws = f"ws://127.0.0.1:{self.port}/ws"

    def _drain_stderr(self) -> None:
        for line in self.proc.stderr:  # type: ignore[union-attr]
            self.stderr.append(line)

    def _wait_for_url(self, timeout: float) -> tuple[str, int]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()  # type: ignore[union-attr]
            if not line:
                if self.proc.poll() is not None:
                    break
                continue
            match = URL_LINE.search(line)
            if match:
                return match.group(1), int(match.group(2))
        self.stop()
        raise RuntimeError("server did not start:\n" + "".join(self.stderr[-30:]))

    def log_lines(self, contains: str, since: int = 0) -> str:
        """The stderr lines from line `since` on that contain `contains` (a logger's name), for a failure
        message."""
        return "".join(line for line in self.stderr[since:] if contains in line)

    def rss_kib(self, field: str = "VmRSS") -> int:
        """Resident memory of the server: its process and its workers (`serve --workers`), added up;
        `field="RssAnon"`: the heap only, not the avatar frames a worker maps as sessions reach them."""
        return sum(status_kib(pid, field) for pid in process_tree(self.proc.pid))

    def stop(self) -> None:
        """Terminate and reap the process."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def avatars_root(small_avatar, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding two avatars, `small` and `second` (a renamed copy)."""
    root = tmp_path_factory.mktemp("served_avatars")
    copy_avatar(Path(small_avatar.path), root, "small")
    copy_avatar(Path(small_avatar.path), root, "second")
    return root


@pytest.fixture(scope="module")
def live_server(avatars_root: Path) -> Iterator[ServerProcess]:
    """A real server process with the viseme engine, stopped after the module."""
    server = ServerProcess(avatars_root)
    yield server
    server.stop()


def write_speech_wav(path: Path, speech, lead_samples: int = 0, tail_samples: int = 4800) -> Path:  # noqa: ANN001
    """A spoken question as a 16 kHz mono s16 WAV: `lead_samples` of silence, the float32 speech, then
    `tail_samples` of silence (what a microphone hears around it)."""
    import wave

    import numpy as np

    silence = np.zeros(lead_samples, np.float32), np.zeros(tail_samples, np.float32)
    pcm = np.concatenate([silence[0], speech, silence[1]])
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(np.clip(pcm * 32767, -32768, 32767).astype("<i2").tobytes())
    return path


class FakeLLMProcess:
    """tests/fake_llm_server.py (an OpenAI-compatible streaming endpoint) in a subprocess on a free port."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "fake_llm_server.py"), "--port", "0", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        match = re.search(r"(http://[\d.]+:\d+)", line)
        if not match:
            self.proc.kill()
            raise RuntimeError(f"fake LLM server did not start: {line} {self.proc.stderr.read()}")  # type: ignore[union-attr]
        self.url = match.group(1)

    def stop(self) -> None:
        """Terminate and reap it."""
        self.proc.terminate()
        self.proc.wait(timeout=10)


async def talk_until(ws, kind: str, avatar: str = "small", timeout: float = 30.0) -> dict:  # noqa: ANN001
    """Say a Talk session's hello on the open WebSocket `ws`, then read until a text message of type `kind`
    (returned)."""
    await ws.send(json.dumps({"type": "hello", "version": 1, "avatar": avatar, "agent": True}))
    while True:
        message = await asyncio.wait_for(ws.recv(), timeout)
        if isinstance(message, str) and (event := json.loads(message))["type"] == kind:
            return event


def agent_with_fake_llm(
    avatars_dir: Path, llm_args: tuple[str, ...], *server_args: str
) -> Iterator[ServerProcess]:
    """For a module fixture: a `serve --agent` process answering with tests/fake_llm_server.py (started with
    `llm_args`), the silence rule ending turns (no turn-judging model), INFO logs kept; both stopped after."""
    llm = FakeLLMProcess(*llm_args)
    try:
        server = ServerProcess(
            avatars_dir, "--agent", "--llm-url", llm.url, "--turn-detector", "silence", *server_args,
            verbose=True,
        )  # fmt: skip
        yield server
        server.stop()
    finally:
        llm.stop()


BROWSER_DIR = REPO / "tests" / "browser"
CHROMIUM = Path("/usr/lib/chromium/chromium")


def run_browser_script(script: str, options: dict, timeout: float) -> dict:
    """Run a playwright-core driver in tests/browser (player.mjs, talk.mjs) with these options; its last
    JSON line. Fails the test when the script reports a failure or prints no result."""
    if not (BROWSER_DIR / "node_modules" / "playwright-core").is_dir() or not CHROMIUM.exists():
        pytest.fail(
            "browser tests need chromium and `cd tests/browser && npm install` (make setup does both)"
        )
    done = subprocess.run(
        [shutil.which("node") or "node", script, json.dumps(options)],
        cwd=BROWSER_DIR, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no result from the browser script: {done.stdout[-2000:]} {done.stderr[-2000:]}"
    result = json.loads(lines[-1])
    assert done.returncode == 0, result.get("failed")
    return result

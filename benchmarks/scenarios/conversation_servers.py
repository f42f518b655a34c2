"""The conversation benchmark's processes: the agent server, the fake and local LLM servers, memory."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench_common import start_server

import lipstream

REPO = Path(__file__).resolve().parents[2]
# the lipstream this process imports: its server is the one measured (PYTHONPATH picks the tree, so
# before_after.py --script-from-after measures an older tree with this script and its questions)
TREE = Path(lipstream.__file__).resolve().parent.parent
FAKE_REPLY = "Here is a short answer for you. I hope that it helps."
# keeps each answer a few seconds long, so the bench takes minutes (the first frame's latency is unaffected)
MAX_REPLY_TOKENS = 32


# ----- processes ------------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_fake_llm() -> tuple[subprocess.Popen, str]:
    """tests/fake_llm_server.py (first token at once) as a process; its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "fake_llm_server.py"), "--port", str(port),
         "--text", FAKE_REPLY],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the fake LLM server did not start")


def start_local_llm() -> tuple[subprocess.Popen, str, str]:
    """The embedded SmolLM2 behind its OpenAI-compatible endpoint (lipstream.talk.models.llm_child) as a
    server of
    its own, as a user's local llama.cpp server would be: the process, its URL and its key."""
    import secrets

    from lipstream.talk.models.llm_llama import bundled_gguf_path

    key = secrets.token_hex(16)
    cmd = [sys.executable, "-m", "lipstream.talk.models.llm_child", "--model", str(bundled_gguf_path()),
           "--parent-pid", str(os.getpid()), "--threads", "1", "--name", "local-smollm2"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=TREE, env={**os.environ, "LIPSTREAM_MODEL_KEY": key},
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith("{") and '"ready"' in line:
            return proc, f"http://127.0.0.1:{json.loads(line)['port']}/v1", key
    proc.kill()
    raise RuntimeError("the local SmolLM2 server did not start")


def start_agent_server(
    avatars_dir: Path, extra: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str, float]:
    """`lipstream serve --agent ...` on a free port; the process, its ws URL and seconds until it listened."""
    args = ["--avatars-dir", str(avatars_dir), "--agent", "--max-reply-tokens", str(MAX_REPLY_TOKENS), *extra]
    proc, http, seconds = start_server(args, cwd=TREE, env=env)
    return proc, http.replace("http://", "ws://", 1) + "/ws", seconds


def stop(proc: subprocess.Popen) -> None:
    """Terminate one process we started, and reap it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class RssSampler:
    """Samples a process's resident memory every 50 ms; `peak()` since the last `reset()`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _field(self, name: str) -> int:
        status = Path(f"/proc/{self.pid}/status").read_text()
        return int(re.search(rf"{name}:\s+(\d+)", status).group(1))

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self._peak = max(self._peak, self._field("VmRSS"))
            except (OSError, AttributeError):
                return

    def reset(self) -> None:
        """Start a new phase."""
        self._peak = self._field("VmRSS")

    def peak_mib(self) -> float:
        """The highest VmRSS seen in this phase, MiB."""
        return round(max(self._peak, self._field("VmRSS")) / 1024, 1)

    def hwm_mib(self) -> float:
        """The kernel's high-water mark of the process's RSS (VmHWM), MiB."""
        return round(self._field("VmHWM") / 1024, 1)

    def close(self) -> None:
        """Stop sampling."""
        self._stop.set()

"""What the benchmark scripts share: the avatar they measure on."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from lipstream.avatar.bundle import AvatarBundle, load_avatar
from lipstream.avatar.sample import build_sample_avatar
from lipstream.errors import AvatarError


def open_or_build_avatar(name: str) -> AvatarBundle:
    """The avatar called `name` in $LIPSTREAM_HOME (default ~/.lipstream), built as the sample if missing."""
    os.environ.setdefault("LIPSTREAM_HOME", str(Path.home() / ".lipstream"))
    try:
        return load_avatar(name)
    except AvatarError:
        return build_sample_avatar(name)


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (platform.processor() elsewhere), recorded with each figure."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def start_server(
    args: list[str], cwd: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str, float]:
    """`lipstream serve --port 0 ARGS` run from `cwd`; the process, its http://HOST:PORT and the seconds until
    it listened (RuntimeError with its stderr when it does not start)."""
    started = time.perf_counter()
    log = tempfile.TemporaryFile("w+")
    cmd = [sys.executable, "-m", "lipstream", "serve", "--port", "0", *args]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    for line in proc.stdout:  # type: ignore[union-attr]
        match = re.search(r"(http://[\d.]+:\d+)", line)
        if match:
            return proc, match.group(1), time.perf_counter() - started
    log.seek(0)
    raise RuntimeError("server did not start:\n" + log.read()[-3000:])


def rss_mib(pid: int) -> float:
    """Resident memory (VmRSS) of one process, MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024


def child_pids(pid: int) -> list[int]:
    """A process's direct children (the model process of `serve --agent`)."""
    tasks = Path(f"/proc/{pid}/task").iterdir()
    return [int(child) for task in tasks for child in (task / "children").read_text().split()]

"""What the benchmark scripts share: the avatar they measure on, a server, a client session, a player."""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# cpu_model is re-exported: the scripts import it from here. It comes from the sibling module, not the
# `benchmarks` package, so that sys.path is left alone: a before/after worker must import the lipstream its
# PYTHONPATH names, not this checkout's
from results import cpu_model  # noqa: F401

from lipstream.avatar.bundle import AvatarBundle, load_avatar
from lipstream.avatar.sample import build_sample_avatar
from lipstream.errors import AvatarError


def talk_model(name: str) -> Any:
    """lipstream.talk.models.<name> of the lipstream imported (lipstream.talk.<name> in an older tree)."""
    try:
        return importlib.import_module(f"lipstream.talk.models.{name}")
    except ImportError:
        return importlib.import_module(f"lipstream.talk.{name}")


def guard_alone(grounding: Any, system_prompt: str, text: str) -> tuple[str, list[str]]:
    """What a knowledge grounding's guard says for the question `text` when the model never keeps to the
    notes (a stand-in that always strays: the notes' own sentence, or the unknown answer): the reply and its
    sources."""

    async def strays() -> Any:
        yield "Our zebra keeps the purple umbrellas on the moon."

    async def reply() -> tuple[str, list[str]]:
        grounded = grounding.ground(system_prompt, text)
        said = [s async for s in grounding.guard(grounded, strays())]
        return " ".join(said), list(grounded.sources)

    return asyncio.run(reply())


def open_or_build_avatar(name: str) -> AvatarBundle:
    """The avatar called `name` in $LIPSTREAM_HOME (default ~/.lipstream), built as the sample if missing."""
    os.environ.setdefault("LIPSTREAM_HOME", str(Path.home() / ".lipstream"))
    try:
        return load_avatar(name)
    except AvatarError:
        return build_sample_avatar(name)


def served_avatar_manifest(avatars_dir: Path, name: str) -> dict:
    """The manifest of the avatar a benchmark's server will serve from `avatars_dir`, built as the sample
    there first if missing."""
    if not (avatars_dir / name / "manifest.json").is_file():
        os.environ["LIPSTREAM_HOME"] = str(avatars_dir.parent)
        open_or_build_avatar(name)
    return json.loads((avatars_dir / name / "manifest.json").read_text())


def start_server(
    args: list[str], cwd: Path, env: dict[str, str] | None = None, launcher: list[str] | None = None
) -> tuple[subprocess.Popen, str, float]:
    """`lipstream serve --port 0 ARGS` run from `cwd`; the process, its http://HOST:PORT and the seconds until
    it listened (RuntimeError with its stderr when it does not start). `launcher`: what runs the CLI instead
    of `python -m lipstream` (a script that wraps the server, e.g. first_frame_trace.py)."""
    started = time.perf_counter()
    log = tempfile.TemporaryFile("w+")
    cmd = [*(launcher or [sys.executable, "-m", "lipstream"]), "serve", "--port", "0", *args]
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=log, text=True)
    for line in proc.stdout:  # type: ignore[union-attr]
        match = re.search(r"(http://[\d.]+:\d+)", line)
        if match:
            return proc, match.group(1), time.perf_counter() - started
    log.seek(0)
    raise RuntimeError("server did not start:\n" + log.read()[-3000:])


async def open_session(url: str, avatar: str, **hello) -> tuple:
    """A WebSocket session: connect to `url` (ws://HOST:PORT/ws), send hello (with `hello`'s fields),
    and the server's first answer (`ready` or an error)."""
    import websockets  # only the WebSocket benchmarks need it

    ws = await websockets.connect(url, max_size=None, open_timeout=20)
    await ws.send(json.dumps({"type": "hello", "version": 1, "avatar": avatar, **hello}))
    return ws, json.loads(await asyncio.wait_for(ws.recv(), 60))


def rss_mib(pid: int) -> float:
    """Resident memory (VmRSS) of one process, MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024


def child_pids(pid: int) -> list[int]:
    """A process's direct children (the model process of `serve --agent`)."""
    tasks = Path(f"/proc/{pid}/task").iterdir()
    return [int(child) for task in tasks for child in (task / "children").read_text().split()]


JITTER_S = 0.15  # the browser player's buffer before it starts playing


async def play_like_a_player(ws, seconds: float, kinds: tuple = ()) -> dict:
    """Read a speaking session as the browser player would: play from the first frame + a 150 ms jitter
    buffer, report the playing position every 100 ms; a frame that arrives after its display time is late
    (a player skips it). Counts over `seconds` of playback; `kinds`: the media kinds that are frames
    (default: whole-frame video)."""
    from lipstream.server.protocol import Kind, decode_media  # only the WebSocket benchmarks need it

    kinds = kinds or (Kind.VIDEO,)
    first_arrival = first_pts = None
    frames = late = 0
    worst = 0.0
    stop = asyncio.Event()

    async def report_position() -> None:
        while not stop.is_set():
            await asyncio.sleep(0.1)
            if first_arrival is not None:
                playing = first_pts + int((time.monotonic() - first_arrival - JITTER_S) * 16000)
                if playing > first_pts:
                    await ws.send(json.dumps({"type": "position", "pts": playing}))

    reporter = asyncio.create_task(report_position())
    try:
        end = None
        while end is None or time.monotonic() < end:
            data = await asyncio.wait_for(ws.recv(), 30)
            if not isinstance(data, bytes):
                continue
            media = decode_media(data)
            if media.kind not in kinds:
                continue
            now = time.monotonic()
            if first_arrival is None:
                first_arrival, first_pts = now, media.pts
                end = now + seconds
            lateness = now - (first_arrival + JITTER_S + (media.pts - first_pts) / 16000)
            frames += 1
            if lateness > 0:
                late += 1
                worst = max(worst, lateness * 1000)
    finally:
        stop.set()
        reporter.cancel()
    return {"frames": frames, "late": late, "worst_late_ms": round(worst, 1), "holds": late <= 0.01 * frames}

"""`lipstream serve --ray` on a real local Ray cluster, started once for the module: 2 replicas of the viseme
server (1 CPU each) behind Serve's proxy; sessions land on both, frames flow, /metrics answers for both
replicas, a replica killed mid-session ends its session and new sessions still work, the player page
reconnects by itself, and the whole thing stops cleanly.

Ray is in the one environment (`make setup`, the `ray` extra; issue 24): the server runs under this test's
own Python, and this test process only speaks HTTP and WebSocket to it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import server_harness as harness
import websockets
from prometheus_client.parser import text_string_to_metric_families
from server_harness import ServerProcess
from test_server_live import collect, open_session

from lipstream.server.protocol import Kind

avatars_root = harness.avatars_root  # shared fixtures

pytestmark = pytest.mark.slow

RAY_PYTHON = Path(sys.executable)
RECONNECT_CODES = {1001, 1006, 1011, 1012}  # what the player reconnects on (docs/protocol.md)


def _ray_importable() -> str | None:
    """Why Ray cannot run here, or None."""
    done = subprocess.run([str(RAY_PYTHON), "-c", "import ray.serve"], capture_output=True, text=True)
    if done.returncode != 0:
        why = done.stderr.strip().splitlines()[-1:]
        return f"ray[serve] does not import here (pip install -e '.[ray]'): {why}"
    return None


def get_json(url: str) -> dict:
    """GET a JSON endpoint."""
    with urllib.request.urlopen(url, timeout=10) as res:
        return json.loads(res.read())


@pytest.fixture(scope="module")
def ray_server(avatars_root: Path):
    """`lipstream serve --ray` with 2 replicas on a local cluster (skipped when Ray is not installed)."""
    reason = _ray_importable()
    if reason:
        pytest.skip(reason)
    # the engine's caches are built before the server starts, like a serving image's: replicas only read them
    from lipstream.engines.registry import create_engine
    from lipstream.server.warmup import warm_up

    warm_up(create_engine("viseme"), avatars_root)
    server = ServerProcess(
        avatars_root, "--ray", "--min-replicas", "2", "--max-replicas", "2", "--sessions-per-replica", "3",
        "--cpus-per-replica", "1", python=str(RAY_PYTHON), start_timeout=240.0,
        env={"RAY_DEDUP_LOGS": "0", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    yield server
    server.stop()


def replica_pids(base: str, want: int = 2, timeout: float = 30.0) -> dict[str, int]:
    """{replica id: pid} of the live replicas, as /healthz lists them (from the application's board, whichever
    replica the proxy picks: on a loaded box it kept picking one for minutes)."""
    found: dict[str, int] = {}
    deadline = time.monotonic() + timeout
    while len(found) < want and time.monotonic() < deadline:
        health = get_json(base + "/healthz")
        assert health["replicas"][health["replica"]] == health["pid"]  # the answering one is listed
        found = {k: int(v) for k, v in health["replicas"].items()}
        if len(found) < want:
            time.sleep(0.5)
    return found


async def open_on(url: str, count: int) -> list[tuple[websockets.ClientConnection, dict]]:
    """Open `count` sessions at once."""
    return list(await asyncio.gather(*(open_session(url, "small") for _ in range(count))))


async def close_all(sessions: list[tuple[websockets.ClientConnection, dict]]) -> None:
    """Close sessions at once: each one never read closed only at websockets' 10 s close timeout (code 1006,
    measured; its frames are queued ahead of the server's close frame), one after another 30 s for three."""
    await asyncio.gather(*(ws.close() for ws, _ in sessions))


async def open_as_the_player_does(
    url: str, count: int, within: float = 60.0
) -> list[tuple[websockets.ClientConnection, dict]]:
    """Open `count` sessions at once, each retried as the player page retries (player.js) until `within`
    seconds have passed: around a replica's death Serve's proxy may still route a handshake to it, which then
    never completes (CI: 'timed out during opening handshake' after websockets' 10 s)."""
    deadline = time.monotonic() + within

    async def one() -> tuple[websockets.ClientConnection, dict]:
        while True:
            try:
                return await open_session(url, "small")
            except (OSError, TimeoutError, websockets.WebSocketException):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1.0)

    return list(await asyncio.gather(*(one() for _ in range(count))))


async def speak_and_count_frames(ws) -> int:
    """Speak one sentence; the number of speech video frames until playback_finished."""
    await ws.send(json.dumps({"type": "speak", "text": "Good evening, here is the news."}))
    media, _ = await collect(ws, lambda m: m["type"] == "playback_finished", timeout=90)
    return sum(1 for m in media if m.kind == Kind.VIDEO and m.flags & 2)


def test_sessions_spread_over_both_replicas_and_frames_flow(ray_server: ServerProcess) -> None:
    health = get_json(ray_server.http + "/healthz")
    assert health["status"] == "ok" and health["warmup_failures"] == [] and health["warmup_seconds"] >= 0

    async def run() -> set[str]:
        sessions = await open_on(ray_server.ws, 4)
        try:
            assert all(ready["type"] == "ready" for _, ready in sessions), [r for _, r in sessions]
            frames = await speak_and_count_frames(sessions[0][0])
            assert frames >= 25  # over a second of speech came through the proxy
            return {ready["replica"] for _, ready in sessions}
        finally:
            await close_all(sessions)

    replicas = asyncio.run(run())
    assert len(replicas) == 2, replicas  # 4 sessions, at most 3 per replica: both replicas hold some

    time.sleep(2.5)  # replicas report to the board every 2 s
    with urllib.request.urlopen(ray_server.http + "/metrics", timeout=10) as res:
        families = {f.name: f for f in text_string_to_metric_families(res.read().decode())}
    opened = [s for s in families["lipstream_sessions_opened"].samples if s.name.endswith("_total")]
    assert {s.labels["replica"] for s in opened} == replicas  # one /metrics answers for every replica
    assert sum(s.value for s in opened) >= 4


def test_a_killed_replica_ends_its_session_and_new_sessions_still_work(ray_server: ServerProcess) -> None:
    pids = replica_pids(ray_server.http)
    assert len(pids) == 2, pids

    async def run() -> tuple[int | None, float]:
        sessions = await open_on(ray_server.ws, 2)
        victim_ws, victim_ready = sessions[0]
        await close_all(sessions[1:])
        victim = victim_ready["replica"]
        await victim_ws.recv()  # frames flow
        killed_at = time.monotonic()
        os.kill(pids[victim], signal.SIGKILL)
        code = await harness.close_code_when_dropped(victim_ws, 30)
        ended_after = time.monotonic() - killed_at
        # new sessions work (the other replica), then again once Serve has replaced the dead one
        fresh = await open_as_the_player_does(ray_server.ws, 2)
        try:
            assert all(ready["type"] == "ready" for _, ready in fresh), [r for _, r in fresh]
            assert all(ready["replica"] != victim for _, ready in fresh)
            assert await speak_and_count_frames(fresh[0][0]) >= 25
        finally:
            await close_all(fresh)
        return code, ended_after

    code, ended_after = asyncio.run(run())
    assert code in RECONNECT_CODES, code  # a code the player reconnects on
    assert ended_after < 15

    # Serve starts a replacement (warmed before it takes traffic); a loaded CI box once took over 120 s
    deadline = time.monotonic() + 180
    seen: dict[str, int] = {}
    while time.monotonic() < deadline and not set(seen) - set(pids):
        seen.update(replica_pids(ray_server.http, timeout=5))
        time.sleep(1)
    log = "".join(ray_server.stderr[-30:])
    assert set(seen) - set(pids), (pids, seen, log)  # a replica Serve started after the kill answers

    # and the deployment holds two replicas again: 4 sessions at once, at most 3 per replica, land on both
    # (the proxy picks where /healthz goes, and on a loaded box it kept picking one replica for minutes)
    async def spread() -> set[str]:
        sessions = await open_as_the_player_does(ray_server.ws, 4)
        try:
            assert all(ready["type"] == "ready" for _, ready in sessions), [r for _, r in sessions]
            return {ready["replica"] for _, ready in sessions}
        finally:
            await close_all(sessions)

    holders = asyncio.run(spread())
    assert len(holders) == 2 and holders - set(pids), (pids, seen, holders)


@pytest.mark.browser
def test_the_player_page_reconnects_by_itself_when_its_replica_dies(
    ray_server: ServerProcess, tmp_path: Path
) -> None:
    replica_pids(ray_server.http)  # both replicas up (the previous test waited for the replacement)
    shot = tmp_path / "reconnected.png"
    result = harness.run_browser_script(
        "reconnect.mjs", {"url": ray_server.http, "avatar": "small", "screenshot": str(shot)}, timeout=240
    )
    assert result["first"] != result["second"]  # a new session, on a live replica
    assert "reconnecting" in result["statusWhileDown"] and "replica gone" in result["statusWhileDown"]
    assert result["statusAfter"].startswith("reconnected: new session on small")
    closed = next(e for e in result["log"] if e["type"] == "closed")
    assert closed["code"] in RECONNECT_CODES and closed["reconnecting"] is True
    assert result["speechFramesShown"] > 10  # and it speaks again
    assert shot.stat().st_size > 0


def test_zz_stops_cleanly(ray_server: ServerProcess) -> None:
    """SIGTERM takes the application and the local cluster down; no Ray process is left behind."""
    children = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(ray_server.proc.pid)], capture_output=True, text=True
    ).stdout.split()
    assert children  # the local cluster's gcs_server and raylet

    async def live_session_sees_going_away() -> int | None:
        ws, ready = await open_session(ray_server.ws, "small")
        assert ready["type"] == "ready"
        ray_server.proc.send_signal(signal.SIGTERM)
        return await harness.close_code_when_dropped(ws, 60)

    # the proxy goes down with the application, so a live session sees its connection drop (1006); 1001
    # (a replica removed while the proxy stays) is what a scale-down sends: either way the player reconnects
    assert asyncio.run(live_session_sees_going_away()) in RECONNECT_CODES
    assert ray_server.proc.wait(timeout=60) == 0, "".join(ray_server.stderr[-20:])
    time.sleep(1)
    alive = [pid for pid in children if Path(f"/proc/{pid}").exists()]
    assert not alive, alive

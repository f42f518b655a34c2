"""`lipstream serve --workers 2`: one port, two worker processes; sessions in both are seen from either;
a killed worker is replaced; the workers never outlive the supervisor. Plus the shared counts and the
summed exposition, in process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import server_harness as harness
from prometheus_client.parser import text_string_to_metric_families
from server_harness import ServerProcess
from test_server_live import collect, http_json, open_session

from lipstream.server.protocol import Kind

avatars_root = harness.avatars_root  # shared fixtures


def worker_pids(parent: int) -> set[int]:
    """The live child processes of `parent` (its workers)."""
    done = subprocess.run(["ps", "-o", "pid=", "--ppid", str(parent)], capture_output=True, text=True)
    return {int(p) for p in done.stdout.split()}


def alive(pid: int) -> bool:
    """Whether a process with this id exists (and is not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def private_folder(pid: int) -> Path:
    """The server's private folder, found through a worker's open shared-count file."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = Path(os.readlink(fd))
        if target.name == "sessions.count":
            return target.parent
    raise AssertionError("the worker holds no shared count file")


def live_sessions(base: str) -> float:
    """lipstream_sessions_live from /metrics."""
    text = http_get(base + "/metrics")
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == "lipstream_sessions_live")  # fmt: skip


def http_get(url: str) -> str:
    """GET a text body (a new connection each time, so either worker may answer)."""
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as res:
        return res.read().decode()


@pytest.fixture(scope="module")
def server(avatars_root: Path):
    """Two workers, a whole-server cap of two sessions."""
    proc = ServerProcess(avatars_root, "--workers", "2", "--max-sessions", "2")
    yield proc
    proc.stop()


@pytest.mark.slow
def test_sessions_in_any_worker_are_seen_from_every_worker(server: ServerProcess) -> None:
    assert len(worker_pids(server.proc.pid)) == 2

    async def run() -> None:
        opened = [await open_session(server.ws, name) for name in ("small", "second")]
        assert all(ready["type"] == "ready" for _, ready in opened)
        refused, busy = await open_session(server.ws, "small")  # the cap is the whole server's
        assert busy["code"] == "busy"
        await refused.close()
        answered_by: set[int] = set()
        for _ in range(40):  # each request is a new connection: the kernel hands it to either worker
            health = json.loads(http_get(server.http + "/healthz"))
            assert health["workers"] == 2 and health["sessions"] == 2
            _, admin = http_json(server.http + "/api/sessions")
            assert len(admin["sessions"]) == 2 and admin["max_sessions"] == 2
            assert live_sessions(server.http) == 2
            answered_by.add(health["worker"])
            if answered_by == {0, 1}:
                break
        assert answered_by == {0, 1}, "one worker answered every request"
        for ws, _ in opened:
            await ws.send(json.dumps({"type": "speak", "text": "Both of us."}))
        for ws, _ in opened:
            media, _ = await collect(ws, lambda m: m["type"] == "playback_finished", timeout=60)
            assert sum(1 for m in media if m.kind == Kind.VIDEO) >= 10
            await ws.close()

    asyncio.run(run())
    deadline = time.monotonic() + 10
    while json.loads(http_get(server.http + "/healthz"))["sessions"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert json.loads(http_get(server.http + "/healthz"))["sessions"] == 0


@pytest.mark.slow
def test_a_killed_worker_is_replaced_and_the_server_keeps_serving(server: ServerProcess) -> None:
    before = worker_pids(server.proc.pid)
    victim = min(before)
    os.kill(victim, signal.SIGKILL)

    async def one_session() -> None:
        ws, ready = await open_session(server.ws, "small")
        assert ready["type"] == "ready"
        await ws.send(json.dumps({"type": "speak", "text": "Still here."}))
        media, _ = await collect(ws, lambda m: m["type"] == "playback_finished", timeout=60)
        assert any(m.kind == Kind.VIDEO for m in media)
        await ws.close()

    asyncio.run(one_session())  # the other worker serves meanwhile
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline:
        now = worker_pids(server.proc.pid)
        if len(now) == 2 and victim not in now and "is serving again" in "".join(server.stderr):
            break
        time.sleep(0.2)
    assert len(now) == 2 and victim not in now, now
    log = "".join(server.stderr)
    assert f"(pid {victim}) exited with signal SIGKILL" in log, log[-2000:]
    assert json.loads(http_get(server.http + "/healthz"))["workers"] == 2
    asyncio.run(one_session())


@pytest.mark.slow
def test_sigterm_stops_every_worker_and_removes_the_folder(server: ServerProcess) -> None:
    pids = worker_pids(server.proc.pid)
    folder = private_folder(min(pids))
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=15) == 143
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(p) for p in pids)
    assert not folder.exists()


@pytest.mark.slow
def test_workers_die_with_a_killed_supervisor(avatars_root: Path) -> None:
    server = ServerProcess(avatars_root, "--workers", "2")
    try:
        pids = worker_pids(server.proc.pid)
        assert len(pids) == 2
        server.proc.kill()
        server.proc.wait()
        deadline = time.monotonic() + 10
        while any(alive(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(alive(p) for p in pids)
    finally:
        server.stop()


def test_shared_tally_caps_the_sum(tmp_path: Path) -> None:
    from lipstream.server.tally import SharedTally

    a, b = SharedTally(tmp_path / "t", 2, 0), SharedTally(tmp_path / "t", 2, 1)
    assert a.try_add(0, 2) and b.try_add(0, 2)
    assert not a.try_add(1, 2) and not b.try_add(1, 2)
    assert a.total() == b.total() == 2
    b.set(0)
    assert a.try_add(1, 2) and a.total() == 2
    a.clear_cell(0)
    assert b.total() == 0
    a.close()
    b.close()


def test_summed_exposition_reads_like_one_process() -> None:
    from lipstream.server.metrics import ServerMetrics, sum_expositions

    one, two = ServerMetrics(), ServerMetrics()
    one.session_refused("busy")
    two.session_refused("busy")
    two.stage("encode", 0.003)
    one.bind_live_sessions(lambda: 2)
    two.bind_live_sessions(lambda: 1)
    merged = sum_expositions([one.render().decode(), two.render().decode()]).decode()
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(merged) for s in f.samples}  # fmt: skip
    assert samples[("lipstream_sessions_live", ())] == 3
    assert samples[("lipstream_sessions_refused_total", (("reason", "busy"),))] == 2
    assert samples[("lipstream_render_stage_seconds_count", (("stage", "encode"),))] == 1
    assert samples[("lipstream_render_stage_seconds_bucket", (("le", "0.005"), ("stage", "encode")))] == 1

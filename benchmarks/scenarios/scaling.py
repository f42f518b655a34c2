"""Scaling out (issue 14): `lipstream serve --ray` on a local Ray cluster against direct `lipstream serve`.

Figures, each from real servers and real WebSocket clients:
- speak -> first speech frame at the client, p50/p95, direct and through Serve's proxy (1 replica), the
  requests interleaved in one run; Chromium's A/V offset on both when the browser driver is installed;
- sessions that hold 25 fps with 1 and with 2 replicas (received frame rate of every session, all speaking);
- failover: a witness session's replica is killed (SIGKILL); time until it streams again from another
  replica (it reconnects at once, as the player does on a 1006/1011/1001 close);
- scale-up: min 1 / max 2 replicas, 2 sessions per replica: the third session waits in the proxy until a
  new replica is warm; time from its connect to its first frame. Scale-down: time from the last session's
  end until one replica is left.

Ray runs in .venv with everything else (issue 24); the avatar's engine caches are built here first. Run:

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks scaling --avatars-dir out/home/avatars
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from datetime import date
from pathlib import Path
from typing import Any

import websockets

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO))  # after PYTHONPATH: a before/after run names its own lipstream there
sys.path.insert(0, str(REPO / "tests"))

from bench_common import cpu_model, play_like_a_player  # noqa: E402
from server_harness import ServerProcess, close_code_when_dropped  # noqa: E402

from lipstream.server.protocol import Flags, Kind, decode_media  # noqa: E402

RAY_PYTHON = Path(sys.executable)
TEXT = "Good evening. Here is the news, read by a face that was never filmed saying it."
LONG_TEXT = " ".join([TEXT] * 4)


class Server(ServerProcess):
    """`lipstream serve [...]` (the tests' ServerProcess), timed until it serves."""

    def __init__(self, avatars_dir: Path, *extra: str) -> None:
        started = time.monotonic()
        # a Ray cluster takes 10-20 s to come up on 2 cores, more when loaded
        super().__init__(avatars_dir, *extra, python=str(RAY_PYTHON), start_timeout=600.0)
        self.ready_seconds = round(time.monotonic() - started, 1)

    def stop(self) -> None:
        """SIGTERM and wait: a Serve app takes its replicas and the local cluster down in order."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def get_json(url: str) -> dict:
    """GET a JSON endpoint."""
    with urllib.request.urlopen(url, timeout=10) as res:
        return json.loads(res.read())


def replicas_in_metrics(http: str) -> set[str]:
    """Replica ids that reported to the board lately (labels on /metrics)."""
    with urllib.request.urlopen(http + "/metrics", timeout=10) as res:
        text = res.read().decode()
    return set(re.findall(r'lipstream_sessions_live\{replica="([^"]+)"\}', text))


HELLO_FAILURES: list[str] = []  # sessions closed before `ready` (retried), reported with the results


async def hello(url: str, avatar: str, width: int, tries: int = 3) -> tuple[Any, dict]:
    """Open a session; (socket, ready). A socket closed before `ready` is retried (and counted)."""
    for attempt in range(tries):
        ws = await websockets.connect(url, max_size=None, open_timeout=300)  # a full cluster queues it
        await ws.send(json.dumps({"type": "hello", "version": 1, "avatar": avatar, "output_width": width}))
        try:
            while True:
                msg = await asyncio.wait_for(ws.recv(), 300)
                if isinstance(msg, str):
                    ready = json.loads(msg)
                    if ready["type"] in ("ready", "error"):
                        return ws, ready
        except websockets.ConnectionClosed as exc:
            HELLO_FAILURES.append(f"{url}: closed before ready ({exc}), try {attempt + 1}")
            print(HELLO_FAILURES[-1], flush=True)
    raise RuntimeError(f"no session at {url} after {tries} tries")


async def speak_to_first_frame(url: str, avatar: str, width: int) -> float:
    """One session: speak, ms until the first speech video frame arrives."""
    ws, _ = await hello(url, avatar, width)
    try:
        await asyncio.sleep(0.5)  # idle frames flowing, as a page would be
        sent = time.perf_counter()
        await ws.send(json.dumps({"type": "speak", "text": TEXT}))
        while True:
            data = await asyncio.wait_for(ws.recv(), 60)
            if isinstance(data, bytes):
                media = decode_media(data)
                if media.kind == Kind.VIDEO and media.flags & Flags.SPEAKING:
                    return (time.perf_counter() - sent) * 1000.0
    finally:
        await ws.close()


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, max(0, int(round(p / 100 * len(ordered) + 0.5)) - 1))], 1)


async def overhead(direct: Server, ray: Server, avatar: str, width: int, rounds: int) -> dict:
    """Speak -> first frame, direct and through Serve, interleaved."""
    out: dict[str, list[float]] = {"direct": [], "serve": []}
    for _ in range(rounds):
        for name, server in (("direct", direct), ("serve", ray)):
            out[name].append(await speak_to_first_frame(server.ws, avatar, width))
    return {
        name: {
            "p50_ms": pct(v, 50),
            "p95_ms": pct(v, 95),
            "mean_ms": round(statistics.mean(v), 1),
            "n": len(v),
        }
        for name, v in out.items()
    }


async def hold_rate(url: str, avatar: str, width: int, sessions: int, seconds: float = 10.0) -> dict:
    """`sessions` sessions speaking at once, each read as a player reads it (`play_like_a_player`). A
    session holds 25 fps when under 1 % of its frames reach the client after their display time (the rule
    of benchmarks/scenarios/sessions.py)."""
    opened = await asyncio.gather(*(hello(url, avatar, width) for _ in range(sessions)))
    try:
        for ws, _ in opened:
            await ws.send(json.dumps({"type": "speak", "text": LONG_TEXT}))
        played = await asyncio.gather(*(play_like_a_player(ws, seconds) for ws, _ in opened))
    finally:
        for ws, _ in opened:
            await ws.close()
    return {
        "sessions": sessions, "all_hold_25": all(p["holds"] for p in played),
        "late": [p["late"] for p in played], "frames": [p["frames"] for p in played],
        "worst_late_ms": max(p["worst_late_ms"] for p in played),
        "replicas": sorted({ready.get("replica", "-") for _, ready in opened}),
    }  # fmt: skip


async def failover(server: Server, avatar: str, width: int) -> dict:
    """Kill the witness's replica; time until the witness streams again (a new session, at once)."""
    pids: dict[str, int] = {}
    for _ in range(100):  # before any session: an idle replica is as likely as the other to answer
        health = get_json(server.http + "/healthz")
        pids[health["replica"]] = health["pid"]
        if len(pids) == 2:
            break
    ws, ready = await hello(server.ws, avatar, width)
    victim = ready["replica"]
    pid = pids.get(victim)
    assert pid is not None, f"the victim replica never answered /healthz ({pids})"
    await ws.recv()
    killed = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    code = await close_code_when_dropped(ws, 30)
    closed_ms = (time.perf_counter() - killed) * 1000.0
    ws2, ready2 = await hello(server.ws, avatar, width)
    try:
        while True:
            data = await asyncio.wait_for(ws2.recv(), 60)
            if isinstance(data, bytes) and decode_media(data).kind == Kind.VIDEO:
                break
        again_ms = (time.perf_counter() - killed) * 1000.0
    finally:
        await ws2.close()
    return {
        "close_code": code,
        "closed_after_ms": round(closed_ms),
        "streaming_again_after_ms": round(again_ms),
        "new_replica_differs": ready2.get("replica") != victim,
    }


async def scaling(server: Server, avatar: str, width: int, downscale_wait: float) -> dict:
    """Sessions beyond one replica's capacity: time to the first frame on a new replica; then scale-down."""
    first = [await hello(server.ws, avatar, width) for _ in range(2)]  # the one replica is full
    started = time.perf_counter()
    ws3, ready3 = await hello(server.ws, avatar, width)
    while True:
        data = await asyncio.wait_for(ws3.recv(), 120)
        if isinstance(data, bytes):
            break
    up_ms = (time.perf_counter() - started) * 1000.0
    placed = {r["replica"] for _, r in first}
    deadline = time.monotonic() + 15
    while len(seen := replicas_in_metrics(server.http)) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.5)  # both replicas have reported to the board
    if len(seen) < 2:  # the new replica never reported: say so instead of timing a scale-down
        for ws, _ in [*first, (ws3, ready3)]:
            await ws.close()
        return {"scale_up_first_frame_ms": round(up_ms), "third_replica": ready3.get("replica"),
                "first_replicas": sorted(placed), "scale_down_to_one_s": None,
                "replicas_in_metrics": sorted(seen)}  # fmt: skip
    for ws, _ in [*first, (ws3, ready3)]:
        await ws.close()
    ended = time.perf_counter()
    down_s = None
    ones = 0
    while time.perf_counter() - ended < downscale_wait:
        ones = ones + 1 if len(replicas_in_metrics(server.http)) == 1 else 0
        if ones == 3:  # three polls in a row: the removed replica is gone, not a scrape that missed it
            down_s = round(time.perf_counter() - ended - 2.0, 1)
            break
        await asyncio.sleep(1.0)
    return {
        "scale_up_first_frame_ms": round(up_ms),
        "third_on_new_replica": ready3.get("replica") not in placed,
        "scale_down_to_one_s": down_s,
    }


def browser_offset(url: str, avatar: str) -> dict | None:
    """Chromium's A/V offset (tests/browser/player.mjs, speak scenario), or None without the driver."""
    driver = REPO / "tests" / "browser"
    if not (driver / "node_modules" / "playwright-core").is_dir():
        return None
    opts = {"url": url, "scenario": "speak", "avatars": [avatar], "width": 540}
    cmd = ["node", "player.mjs", json.dumps(opts)]
    done = subprocess.run(cmd, cwd=driver, capture_output=True, text=True, timeout=300)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        return {"failed": done.stderr[-300:]}
    snap = json.loads(lines[-1]).get("snap") or {}
    return {"av_offset_ms": snap.get("avOffsetMs"), "ttff_ms": snap.get("ttffMs")}


def main(argv: list[str] | None = None) -> int:
    """Run every scenario and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--avatars-dir", type=Path, required=True)
    parser.add_argument("--avatar", default="sample")
    parser.add_argument("--width", type=int, default=540, help="stream width asked for (default 540)")
    parser.add_argument("--rounds", type=int, default=12, help="speak requests per path (default 12)")
    parser.add_argument("--max-sessions", type=int, default=5, help="most sessions per case (default 5)")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "ray_bench.json")
    parser.add_argument(
        "--parts", default="overhead,hold,failover,scaling",
        help="which parts to run; results merge into --out (default: all)",
    )
    parser.add_argument("--hold-width", type=int, default=1080, help="stream width in the hold case")
    args = parser.parse_args(argv)
    if not RAY_PYTHON.exists():
        print(f"{RAY_PYTHON} is missing: make setup builds it", file=sys.stderr)
        return 2
    from lipstream.engines.registry import create_engine
    from lipstream.server.warmup import warm_up

    warm_up(create_engine("viseme"), args.avatars_dir)  # engine caches built where face tracking lives
    parts = set(args.parts.split(","))
    results: dict = json.loads(args.out.read_text()) if args.out.is_file() else {}
    results.update({
        "date": str(date.today()), "cpu": cpu_model(), "cores": os.cpu_count(), "avatar": args.avatar,
        "width": args.width, "hold_width": args.hold_width, "command": " ".join(sys.argv),
    })  # fmt: skip
    run: dict = {"parts": sorted(parts), "load_average_start": [round(x, 2) for x in os.getloadavg()]}
    print(f"CPU {results['cpu']}, load {run['load_average_start']}", flush=True)
    k = str(args.max_sessions)
    sessions = range(1, args.max_sessions + 1)

    def hold(server: Server) -> list[dict]:
        return [asyncio.run(hold_rate(server.ws, args.avatar, args.hold_width, n)) for n in sessions]

    if parts & {"overhead", "hold"}:
        direct = Server(args.avatars_dir, "--max-sessions", k)
        ray1 = Server(args.avatars_dir, "--ray", "--min-replicas", "1", "--max-replicas", "1",
                      "--sessions-per-replica", k)  # fmt: skip
        results["ray_start_1_replica_s"] = ray1.ready_seconds
        try:
            if "overhead" in parts:
                results["speak_to_first_frame"] = asyncio.run(
                    overhead(direct, ray1, args.avatar, args.width, args.rounds)
                )
                print("overhead", results["speak_to_first_frame"], flush=True)
                results["chromium"] = {"direct": browser_offset(direct.http, args.avatar),
                                       "serve": browser_offset(ray1.http, args.avatar)}  # fmt: skip
                print("chromium", results["chromium"], flush=True)
            if "hold" in parts:
                results["hold_direct"] = hold(direct)
                print("hold direct", results["hold_direct"], flush=True)
                results["hold_1_replica"] = hold(ray1)
                print("hold 1 replica", results["hold_1_replica"], flush=True)
        finally:
            ray1.stop()
            direct.stop()

    if parts & {"hold", "failover"}:
        ray2 = Server(args.avatars_dir, "--ray", "--min-replicas", "2", "--max-replicas", "2",
                      "--sessions-per-replica", k)  # fmt: skip
        results["ray_start_2_replicas_s"] = ray2.ready_seconds
        try:
            if "hold" in parts:
                results["hold_2_replicas"] = hold(ray2)
                print("hold 2 replicas", results["hold_2_replicas"], flush=True)
            if "failover" in parts:
                results["failover"] = asyncio.run(failover(ray2, args.avatar, args.width))
                print("failover", results["failover"], flush=True)
        finally:
            ray2.stop()

    if "scaling" in parts:
        auto = Server(args.avatars_dir, "--ray", "--min-replicas", "1", "--max-replicas", "2",
                      "--sessions-per-replica", "2", "--target-sessions", "2",
                      "--downscale-delay", "20")  # fmt: skip
        try:
            results["scaling"] = asyncio.run(scaling(auto, args.avatar, args.width, downscale_wait=150))
            print("scaling", results["scaling"], flush=True)
        finally:
            auto.stop()
    run["hello_failures"] = HELLO_FAILURES
    run["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    results.setdefault("runs", []).append(run)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0

if __name__ == "__main__":
    sys.exit(main())

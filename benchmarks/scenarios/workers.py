"""How many full-size patch sessions hold 25 fps with `serve --workers 1` vs `--workers 2`, side by side.

    LIPSTREAM_HOME=out/home OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks workers \
        [--avatar sample] [--workers 1 2] [--counts 8 12 16 20 24] [--seconds 12] \
        [--out benchmarks/results/workers_bench.json]

One real `lipstream serve --workers W` per W, all started before the first run and measured interleaved per
session count (the same load drift for each). N WebSocket sessions ask for the patch stream at the avatar's
own size, each is sent the same pre-synthesised speech as live PCM, and each is read as the browser player
reads it: play from the first frame + a 150 ms jitter buffer, report the playing position every 100 ms; a
frame that arrives after its display time is late. A session holds 25 fps when under 1 % of its frames are
late (the rule of sessions.py and scaling.py). A worker count that fails at N is not run at larger
N. Also recorded: the server's CPU (supervisor + workers) per frame per session, the sessions per worker
(from /api/sessions) and the load average before each run. Each server first plays an untimed warm-up
round (2 sessions per worker), so no measured run pays for opening the avatar.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import time
import urllib.request
from collections import Counter
from datetime import date
from pathlib import Path

import numpy as np
import websockets
from bench_common import child_pids, cpu_model, open_or_build_avatar, play_like_a_player, start_server

from lipstream.server.protocol import Kind, MediaMessage

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
TEXT = (
    "Good evening. Here is the news, read by a face that was never filmed saying it. The markets were calm "
    "today, and the weather will stay mild through the weekend, with a little rain on Sunday."
)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its direct children (the workers), seconds."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in (pid, *child_pids(pid)):
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


async def play(ws, pcm: bytes, seconds: float) -> dict:
    """Send the speech, then read the session as a player would for `seconds` of playback."""
    await ws.send(MediaMessage(Kind.PCM, pcm, aux=16000).encode())
    await ws.send(json.dumps({"type": "flush"}))
    return await play_like_a_player(ws, seconds, kinds=(Kind.PATCH, Kind.VIDEO))


def sessions_per_worker(http: str) -> dict[str, int]:
    """Live sessions per worker, from /api/sessions (answered for the whole server by any worker)."""
    with urllib.request.urlopen(http + "/api/sessions", timeout=10) as res:
        body = json.loads(res.read())
    return dict(Counter(str(s.get("worker", 0)) for s in body["sessions"]))


async def hold(http: str, pid: int, avatar: str, pcm: bytes, n: int, seconds: float) -> dict:
    """N patch sessions speaking at once; whether each holds 25 fps, and the server CPU it cost."""
    url = http.replace("http://", "ws://") + "/ws"
    opened = []
    for _ in range(n):
        ws = await websockets.connect(url, max_size=None)
        await ws.send(json.dumps({"type": "hello", "version": 1, "avatar": avatar, "stream": "patch"}))
        ready = json.loads(await asyncio.wait_for(ws.recv(), 60))
        if ready["type"] != "ready":
            raise RuntimeError(f"session refused: {ready}")
        opened.append(ws)
    spread = await asyncio.to_thread(sessions_per_worker, http)
    await asyncio.sleep(0.5)  # idle frames flowing, as on a page
    cpu_before, wall_before = cpu_seconds(pid), time.monotonic()
    try:
        played = await asyncio.gather(*(play(ws, pcm, seconds) for ws in opened))
    finally:
        cpu, wall = cpu_seconds(pid) - cpu_before, time.monotonic() - wall_before
        for ws in opened:
            await ws.close()
    frames = sum(p["frames"] for p in played)
    return {
        "sessions": n, "all_hold_25": all(p["holds"] for p in played),
        "late": [p["late"] for p in played], "frames": [p["frames"] for p in played],
        "worst_late_ms": max(p["worst_late_ms"] for p in played), "sessions_per_worker": spread,
        "server_cpu_ms_per_frame": round(cpu * 1000 / max(frames, 1), 2),
        "server_cpu_cores_busy": round(cpu / wall, 2),
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run every worker count at each session count, interleaved; write the JSON and print a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--avatar", default="sample")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--counts", type=int, nargs="+", default=[8, 12, 16, 20, 24])
    parser.add_argument("--seconds", type=float, default=12.0, help="playback measured per session")
    parser.add_argument("--warmup-seconds", type=float, default=4.0, help="untimed first run per server")
    parser.add_argument("--out", type=Path, default=RESULTS / "workers_bench.json")
    args = parser.parse_args(argv)

    bundle = open_or_build_avatar(args.avatar)
    from lipstream.talk.voices.tts import create_tts

    speech = create_tts("piper").synthesize(TEXT)
    pcm = (np.clip(speech.pcm, -1, 1) * 32767).astype("<i2").tobytes()
    cap = str(max(args.counts) + 4)
    servers = {}
    try:
        for w in args.workers:
            serve_args = ["--workers", str(w), "--avatars-dir", str(Path(bundle.path).parent),
                          "--max-sessions", cap, "--max-connections", str(4 * int(cap))]  # fmt: skip
            env = {**os.environ, "OMP_NUM_THREADS": "1"}
            proc, http, took = start_server(serve_args, cwd=REPO, env=env)
            servers[w] = (proc, http)
            print(f"--workers {w}: listening after {took:.1f} s at {http}", flush=True)
            # untimed: every worker opens the avatar and warms its caches before the first measured run
            warm = asyncio.run(hold(http, proc.pid, bundle.name, pcm, 2 * w, args.warmup_seconds))
            print(f"--workers {w}: warmed ({warm['sessions_per_worker']})", flush=True)
        runs: list[dict] = []
        failed: set[int] = set()
        for n in args.counts:
            for w in args.workers:
                if w in failed:
                    continue
                proc, http = servers[w]
                load = os.getloadavg()[0]
                result = asyncio.run(hold(http, proc.pid, bundle.name, pcm, n, args.seconds))
                result.update(workers=w, load_before=round(load, 2))
                runs.append(result)
                print(json.dumps(result), flush=True)
                if not result["all_hold_25"]:
                    failed.add(w)
                time.sleep(2.0)  # let the sessions' threads wind down before the next run
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
    best = {w: max([r["sessions"] for r in runs if r["workers"] == w and r["all_hold_25"]], default=0)
            for w in args.workers}  # fmt: skip
    report = {
        "date": date.today().isoformat(), "cpu": cpu_model(), "cores": len(os.sched_getaffinity(0)),
        "avatar": {"name": bundle.name, "size": list(bundle.size)}, "stream": "patch",
        "seconds": args.seconds, "sessions_holding_25fps": best, "runs": runs,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"sessions_holding_25fps": best, "cpu": report["cpu"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

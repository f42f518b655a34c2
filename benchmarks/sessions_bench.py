"""How many live sessions hold 25 fps on this machine (issue 5), full size and half size.

Run: .venv/bin/python benchmarks/sessions_bench.py [--avatar sample] [--max-sessions 4] [--seconds 12]
     [--sizes full half] [--out benchmarks/results/sessions_bench.json]

N sessions run at once in one process on one shared engine (the same Session code `lipstream serve` runs
per WebSocket), each speaking the same pre-synthesised speech pushed as live PCM, each consumed by a
client loop that plays on its own real-time clock and reports its playback position (as the browser
player does, after a 150 ms jitter buffer). A session holds 25 fps when under 1 % of its frames reach the
client after their display time (a player would skip them). Writes benchmarks/results/sessions_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import time
from pathlib import Path

from bench_common import open_or_build_avatar

from lipstream.engines.registry import create_engine
from lipstream.render.frames import AvatarFrame
from lipstream.render.session import Session, SessionConfig
from lipstream.talk.tts import create_tts

RESULTS = Path(__file__).resolve().parent / "results"
JITTER_SECONDS = 0.15  # the browser player's buffer before it starts playing


async def one_session(bundle, engine, pcm, width: int | None, seconds: float) -> dict:
    """Speak `pcm` once in a fresh session and play it on a simulated client clock.

    A frame is late for the client when it arrives after its display time (first arrival + the jitter
    buffer + pts): a real player would have to skip it. The session's own count (produced after its due
    time on the reported playback clock) is kept beside it."""
    config = SessionConfig(encode=True, output_width=width)
    async with Session(bundle, engine, config) as session:
        session.push_audio(pcm, 16000)
        session.flush()
        started: float | None = None
        frames, late, worst = 0, 0, 0.0
        async for item in session:
            if not isinstance(item, AvatarFrame):
                continue
            now = time.perf_counter()
            if started is None:
                started = now + JITTER_SECONDS  # the client starts playing after its jitter buffer
            frames += 1
            lateness = now - (started + item.pts / 16000)
            if lateness > 0:
                late += 1
                worst = max(worst, lateness * 1000)
            session.update_playback_position(int(max(0.0, now - started) * 16000))
            if item.pts >= seconds * 16000:
                break
        stats = session.stats.as_dict()
    return {
        "frames": frames,
        "late_at_client": late,
        "worst_late_at_client_ms": round(worst, 1),
        "session_late_frames": stats["late_frames"],
        "holds_25fps": late <= 0.01 * frames,
    }


async def run_many(bundle, engine, pcm, width, n: int, seconds: float) -> list[dict]:
    """N concurrent sessions."""
    return list(await asyncio.gather(*(one_session(bundle, engine, pcm, width, seconds) for _ in range(n))))


def main() -> None:
    """Measure 1..N sessions at full and half size; print and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--avatar", default="sample")
    parser.add_argument("--max-sessions", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--sizes", nargs="+", default=["full", "half"], choices=["full", "half"])
    parser.add_argument("--out", default=str(RESULTS / "sessions_bench.json"))
    args = parser.parse_args()
    bundle = open_or_build_avatar(args.avatar)
    engine = create_engine("viseme")
    engine.prepare(bundle)
    text = "Good evening. Here is the news, read by a face that was never filmed saying it. " * 3
    speech = create_tts("piper").synthesize(text)
    w, _ = bundle.size
    results: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "avatar": {"name": bundle.name, "size": list(bundle.size)},
        "seconds": args.seconds,
        "sizes": {},
    }
    for label, width in (("full", None), ("half", w // 2)):
        if label not in args.sizes:
            continue
        rows = {}
        for n in range(1, args.max_sessions + 1):
            per = asyncio.run(run_many(bundle, engine, speech.pcm, width, n, args.seconds))
            rows[n] = {
                "all_hold_25fps": all(r["holds_25fps"] for r in per),
                "late_at_client": [r["late_at_client"] for r in per],
                "worst_late_at_client_ms": max(r["worst_late_at_client_ms"] for r in per),
                "session_late_frames": [r["session_late_frames"] for r in per],
                "frames": [r["frames"] for r in per],
            }
            print(
                f"{label} x{n}: hold 25 fps: {rows[n]['all_hold_25fps']}, "
                f"late at the client {rows[n]['late_at_client']} of {rows[n]['frames']}, "
                f"worst {rows[n]['worst_late_at_client_ms']:.0f} ms"
            )
        holding = [n for n, r in rows.items() if r["all_hold_25fps"]]
        results["sizes"][label] = {"sessions": rows, "max_sessions_holding_25fps": max(holding, default=0)}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

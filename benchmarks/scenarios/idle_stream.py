"""What an idle whole-frame stream costs the server: every idle frame composited and encoded live, against
the idle loop replayed from its encoded GOPs (render/idle_gops.py), side by side in one run.

Run: .venv/bin/python -m benchmarks idle_stream [--avatar sample] [--seconds 12] [--counts 1 2] [--rounds 2]

Each case opens N sessions of the avatar at its own size (the server's session code, H.264 whole frames,
one shared engine and shared idle loops, as `lipstream serve` holds them), plays them on real-time client
clocks, and first lets one pass through the idle loop go by (the replay records it). Then it measures the
process CPU time over `--seconds` of idle stream: cores used per session, ms per frame, bitrate. Both modes
alternate round by round; each figure is the rounds' median. Writes benchmarks/results/idle_stream.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from benchmarks.bench_common import open_or_build_avatar  # noqa: E402
from benchmarks.results import Figure, cpu_model, record  # noqa: E402
from lipstream.audio.timeline import FPS, SAMPLE_RATE  # noqa: E402
from lipstream.engines.registry import create_engine  # noqa: E402
from lipstream.render.frames import AvatarFrame  # noqa: E402
from lipstream.render.idle_gops import SharedIdleGops  # noqa: E402
from lipstream.render.session import RenderSession, SessionConfig  # noqa: E402
from lipstream.render.sinks import WholeFrameH264  # noqa: E402

MODES = ("live", "replay")


async def idle_session(bundle, engine, shared: SharedIdleGops, replay: bool, warm_s: float, seconds: float,
                       started: asyncio.Event, done: list) -> None:
    """One idle session on a client clock: frames until `warm_s + seconds` of stream, the measured stretch's
    bytes and late frames into `done`."""
    config = SessionConfig(encode=True)
    sink = WholeFrameH264(config.bitrate, shared, replay_idle=replay)
    async with RenderSession(bundle, engine, config, sink=sink) as session:
        clock0: float | None = None
        late = frames = video_bytes = replayed_before = 0
        async for item in session:
            if not isinstance(item, AvatarFrame):
                continue
            now = time.perf_counter()
            clock0 = now + 0.15 if clock0 is None else clock0  # the player's jitter buffer
            session.update_playback_position(int(max(0.0, now - clock0) * SAMPLE_RATE))
            at = item.pts / SAMPLE_RATE
            if at >= warm_s:
                if not frames:  # the measured stretch starts: what the warm-up replayed is not counted
                    replayed_before = sink.replay.replayed
                started.set()
                frames += 1
                video_bytes += len(item.access_unit or b"")
                late += now > clock0 + at
            if at >= warm_s + seconds:
                break
        replayed = sink.replay.replayed - replayed_before
        done.append({"frames": frames, "bytes": video_bytes, "late": late, "replayed": replayed})


async def measure(bundle, engine, replay: bool, count: int, warm_s: float, seconds: float) -> dict:
    """`count` idle sessions at once; the CPU they cost after the warm-up stretch."""
    shared = SharedIdleGops()
    started, done = asyncio.Event(), []
    tasks = [
        asyncio.create_task(idle_session(bundle, engine, shared, replay, warm_s, seconds, started, done))
        for _ in range(count)
    ]
    await started.wait()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*tasks)
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    frames = sum(d["frames"] for d in done)
    return {
        "cores_per_session": round(cpu / wall / count, 3),
        "cpu_ms_per_frame": round(cpu * 1000 / max(frames, 1), 2),
        "kbit_per_s_per_session": round(sum(d["bytes"] for d in done) * 8 / 1000 / seconds / count, 1),
        "late_frames": sum(d["late"] for d in done),
        "replayed_share": round(sum(d["replayed"] for d in done) / max(frames, 1), 3),
    }


def main(argv: list[str] | None = None) -> int:
    """Idle stream cost, live encode vs replay, per session count; print and record."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--avatar", default="sample")
    parser.add_argument("--seconds", type=float, default=12.0, help="measured idle stream per case")
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    bundle = open_or_build_avatar(args.avatar)
    engine = create_engine("viseme")
    engine.prepare(bundle)
    warm_s = len(bundle.idle_loop) / FPS + 1.0  # one pass through the loop, recorded by the replay
    print(f"{cpu_model()}; {bundle.name} {bundle.size[0]}x{bundle.size[1]}, idle loop {warm_s - 1:.1f} s")
    runs: dict[str, dict[int, list[dict]]] = {m: {n: [] for n in args.counts} for m in MODES}
    for n in args.counts:
        for r in range(args.rounds):
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                row = asyncio.run(measure(bundle, engine, mode == "replay", n, warm_s, args.seconds))
                runs[mode][n].append(row)
                print(f"  {n} session(s), {mode:6s} round {r + 1}: {row}", flush=True)
    medians = {
        mode: {n: {k: statistics.median(row[k] for row in rows) for k in rows[0]} for n, rows in by_n.items()}
        for mode, by_n in runs.items()
    }
    figures: list[Figure] = []
    for n in args.counts:
        live, replay = medians["live"][n], medians["replay"][n]
        print(
            f"{n} idle session(s): {live['cores_per_session']:.2f} -> {replay['cores_per_session']:.2f} "
            f"cores each, {live['cpu_ms_per_frame']:.1f} -> {replay['cpu_ms_per_frame']:.1f} ms a frame"
        )
        figures += [
            Figure(f"idle full-size stream, {n} session(s), live encode", live["cores_per_session"],
                   "cores per session"),
            Figure(f"idle full-size stream, {n} session(s), replayed", replay["cores_per_session"],
                   "cores per session", goal="<= 0.2"),
        ]
    command = "python -m benchmarks idle_stream " + " ".join(sys.argv[1:] if argv is None else argv)
    extra = {"avatar": bundle.name, "size": list(bundle.size), "seconds": args.seconds, "runs": runs,
             "medians": medians}
    print(record("idle_stream", figures, command, extra=extra))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How many live sessions hold 25 fps on this machine (issue 5), full size and half size.

Run: .venv/bin/python -m benchmarks sessions [--avatar sample] [--max-sessions 4] [--seconds 12]
     [--sizes full half] [--out benchmarks/results/sessions_bench.json]

Neural engine batched across sessions (issue 25), tiny MuseTalk checkpoints of the real topology on CPU,
batched vs per-session in one run, every frame through the engine (acceleration off):
     .venv/bin/python -m benchmarks sessions --engine musetalk --counts 1 2 4 8 --seconds 8 \
     --out benchmarks/results/sessions_batch_bench.json

Patch stream mode (issue 12), full-frame vs patch side by side at the avatar's own size:
     .venv/bin/python -m benchmarks sessions --sizes --streams full patch --counts 1 2 4 8 10 12 \
     --out benchmarks/results/sessions_patch_bench.json
adds, per stream mode and session count, the server CPU ms per frame per session (process CPU time over
the frames of all sessions) and the stream bitrate (video or patch access units, per session).

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
import threading
import time
from pathlib import Path

from bench_common import cpu_model, open_or_build_avatar

from lipstream.engines.registry import create_engine
from lipstream.render.accel import AccelConfig
from lipstream.render.frames import AvatarFrame
from lipstream.render.session import RenderSession, SessionConfig
from lipstream.talk.voices.tts import create_tts

RESULTS = Path(__file__).resolve().parents[1] / "results"
JITTER_SECONDS = 0.15  # the browser player's buffer before it starts playing


async def one_session(
    bundle, engine, pcm, width: int | None, seconds: float, stream: str = "full", accel: bool | None = None
) -> dict:
    """Speak `pcm` once in a fresh session and play it on a simulated client clock.

    A frame is late for the client when it arrives after its display time (first arrival + the jitter
    buffer + pts): a real player would have to skip it. The session's own count (produced after its due
    time on the reported playback clock) is kept beside it."""
    config = SessionConfig(encode=True, output_width=width, stream=stream, accel=AccelConfig(enabled=accel))
    async with RenderSession(bundle, engine, config) as session:
        # as the server does it: features on the speech pool, off the event loop the other sessions share
        await session.push_audio_async(pcm, 16000)
        await session.flush_async()
        started: float | None = None
        frames, late, worst, video_bytes = 0, 0, 0.0, 0
        async for item in session:
            if not isinstance(item, AvatarFrame):
                continue
            now = time.perf_counter()
            if started is None:
                started = now + JITTER_SECONDS  # the client starts playing after its jitter buffer
            frames += 1
            video_bytes += len(item.access_unit or b"")
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
        "kbit_per_s": round(video_bytes * 8 / 1000 / max(frames / 25, 1e-9), 1),
        "ttff_ms": round(stats["ttff_ms"][0], 1) if stats.get("ttff_ms") else None,
    }


async def run_many(
    bundle, engine, pcm, width, n: int, seconds: float, stream: str = "full", accel: bool | None = None
) -> list[dict]:
    """N concurrent sessions."""
    return list(
        await asyncio.gather(
            *(one_session(bundle, engine, pcm, width, seconds, stream, accel) for _ in range(n))
        )
    )


class TimedEngine:
    """The per-session path with its engine calls timed: (start, end, frames) of every render."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.calls: list[tuple[float, float, int]] = []
        self._lock = threading.Lock()

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def render(self, bundle, features, frame_ids):
        """The engine's own render, timed."""
        started = time.perf_counter()
        out = self.engine.render(bundle, features, frame_ids)
        with self._lock:
            self.calls.append((started, time.perf_counter(), len(frame_ids)))
        return out


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Wall time covered by at least one of the intervals (engine calls of several sessions overlap)."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def compare_batching(bundle, engine, pcm, counts: list[int], seconds: float, batch_sizes, wait_ms) -> dict:
    """Per-session engine calls vs the cross-session batcher, interleaved per session count: engine frames
    per second of engine-busy wall time, sessions and frames per pass, first frames, late frames, and
    whether every session got every frame."""
    from lipstream.engines.batched import BatchedEngine
    from lipstream.engines.batcher import BatchConfig

    out: dict = {"per_session": {}, "batched": {}}
    for n in counts:
        for path in ("per_session", "batched"):
            load = os.getloadavg()[0]
            if path == "batched":
                run_engine = BatchedEngine(engine, BatchConfig(batch_sizes=batch_sizes, max_wait_ms=wait_ms))
            else:
                run_engine = TimedEngine(engine)
            started = time.perf_counter()
            per = asyncio.run(run_many(bundle, run_engine, pcm, None, n, seconds, "patch", accel=False))
            wall = time.perf_counter() - started
            if path == "batched":
                stats = run_engine.batcher.stats
                frames, busy = stats.frames, stats.pass_seconds
                extra = run_engine.status()
                run_engine.close()
            else:
                frames = sum(c[2] for c in run_engine.calls)
                busy = busy_seconds([(a, b) for a, b, _ in run_engine.calls])
                extra = {"calls": len(run_engine.calls)}
            row = {
                "engine_frames": frames,
                "engine_busy_seconds": round(busy, 3),
                "engine_frames_per_busy_second": round(frames / max(busy, 1e-9), 1),
                "wall_seconds": round(wall, 2),
                "first_frame_ms": [r["ttff_ms"] for r in per],
                "frames": [r["frames"] for r in per],
                "late_at_client": [r["late_at_client"] for r in per],
                "every_frame": all(r["frames"] >= int(seconds * 25) for r in per),
                "load_average_before": round(load, 2),
                **extra,
            }
            out[path][n] = row
            print(
                f"{path:11s} x{n}: {row['engine_frames_per_busy_second']} engine frames/s busy, "
                f"sessions/pass {extra.get('sessions_per_pass', 1)}, "
                f"frames/pass {extra.get('frames_per_pass')}, "
                f"first frame {max(row['first_frame_ms'] or [0]):.0f} ms, late {row['late_at_client']}, "
                f"every frame {row['every_frame']} (load {load:.1f})", flush=True,
            )  # fmt: skip
        ratio = out["batched"][n]["engine_frames_per_busy_second"] / max(
            out["per_session"][n]["engine_frames_per_busy_second"], 1e-9
        )
        out["batched"][n]["throughput_vs_per_session"] = round(ratio, 2)
    return out


def compare_streams(bundle, engine, pcm, modes: list[str], counts: list[int], seconds: float) -> dict:
    """Full-frame vs patch mode at the avatar's own size, interleaved per session count (one run, the same
    machine load for both): who holds 25 fps, CPU ms per frame per session, bitrate per session."""
    out: dict = {mode: {"sessions": {}} for mode in modes}
    # a mode that no longer holds 25 fps is not run at larger counts: that would only load the machine
    failed: set[str] = set()
    for n in counts:
        for mode in modes:
            if mode in failed:
                continue
            load = os.getloadavg()[0]
            cpu0 = time.process_time()
            per = asyncio.run(run_many(bundle, engine, pcm, None, n, seconds, mode))
            cpu_ms = (time.process_time() - cpu0) * 1000
            frames = sum(r["frames"] for r in per)
            row = {
                "all_hold_25fps": all(r["holds_25fps"] for r in per),
                "late_at_client": [r["late_at_client"] for r in per],
                "worst_late_at_client_ms": max(r["worst_late_at_client_ms"] for r in per),
                "frames": [r["frames"] for r in per],
                "cpu_ms_per_frame_per_session": round(cpu_ms / max(frames, 1), 2),
                "kbit_per_s_per_session": round(sum(r["kbit_per_s"] for r in per) / n, 1),
                "load_average_before": round(load, 2),
            }
            out[mode]["sessions"][n] = row
            if not row["all_hold_25fps"]:
                failed.add(mode)
            print(
                f"{mode} x{n}: hold 25 fps {row['all_hold_25fps']}, late {row['late_at_client']}, worst "
                f"{row['worst_late_at_client_ms']:.0f} ms, "
                f"CPU {row['cpu_ms_per_frame_per_session']} ms/frame, "
                f"{row['kbit_per_s_per_session']} kbit/s per session (load {load:.1f})"
            )
    for mode in modes:
        rows = out[mode]["sessions"]
        holding = [n for n, r in rows.items() if r["all_hold_25fps"]]
        out[mode]["max_sessions_holding_25fps"] = max(holding, default=0)
    return out


def main(argv: list[str] | None = None) -> int:
    """Measure 1..N sessions at full and half size; print and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--avatar", default="sample")
    parser.add_argument("--max-sessions", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=12.0)
    parser.add_argument("--sizes", nargs="*", default=["full", "half"], choices=["full", "half"])
    parser.add_argument("--streams", nargs="*", default=[], choices=["full", "patch"],
                        help="also compare these stream modes at the avatar's own size (issue 12)")
    parser.add_argument("--counts", nargs="+", type=int, default=[1, 2, 4, 8, 10, 12],
                        help="session counts of the --streams comparison")
    parser.add_argument("--out", default=str(RESULTS / "sessions_bench.json"))
    parser.add_argument("--engine", default="viseme", choices=["viseme", "musetalk"],
                        help="musetalk: tiny CPU checkpoints, batched vs per-session (issue 25)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--full-topology", action="store_true",
                        help="musetalk: full-size random weights (the GPU run) instead of tiny ones")
    parser.add_argument("--device", default="cpu", help="musetalk: cpu or cuda")
    parser.add_argument("--dtype", default="float32", help="musetalk: float32 (CPU), float16 (CUDA)")
    parser.add_argument("--compile", action="store_true", help="musetalk: torch.compile every batch size")
    parser.add_argument("--max-batch-wait-ms", type=float, default=40.0)
    args = parser.parse_args(argv)
    bundle = open_or_build_avatar(args.avatar)
    if args.engine == "musetalk":
        run_batching(args, bundle)
        return 0
    engine = create_engine("viseme")
    engine.prepare(bundle)
    text = "Good evening. Here is the news, read by a face that was never filmed saying it. " * 3
    speech = create_tts("piper").synthesize(text)
    w, _ = bundle.size
    results: dict = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "load_average_start": [round(v, 2) for v in os.getloadavg()],
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
    if args.streams:
        results["streams"] = compare_streams(
            bundle, engine, speech.pcm, args.streams, args.counts, args.seconds
        )
        results["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


def run_batching(args: argparse.Namespace, bundle) -> None:
    """The issue-25 comparison on tiny MuseTalk checkpoints (what runs on a CPU machine)."""
    import tempfile

    from lipstream.engines.musetalk.topology import write_model_folder

    with tempfile.TemporaryDirectory(prefix="lipstream-tiny-") as tmp:
        models = write_model_folder(Path(tmp) / "models", versions=("1.5",), tiny=not args.full_topology)
        engine = create_engine(
            "musetalk", models_dir=str(models), device=args.device, dtype=args.dtype, batch_size=8,
            compile=args.compile,
        )  # fmt: skip
        started = time.perf_counter()
        engine.prepare(bundle)  # the tiny VAE's latents, cached in the bundle under that VAE's fingerprint
        prepare_seconds = time.perf_counter() - started
        speech = create_tts("piper").synthesize("Good evening. Here is the news, read by a face. " * 4)
        results = {
            "date": time.strftime("%Y-%m-%d"), "cpu": cpu_model(), "cores": os.cpu_count(),
            "load_average_start": [round(v, 2) for v in os.getloadavg()],
            "avatar": {"name": bundle.name, "size": list(bundle.size)}, "seconds": args.seconds,
            "engine": f"musetalk 1.5, {'full-size' if args.full_topology else 'tiny'} random weights (real "
            f"topology), {args.device} {args.dtype}{' compiled' if args.compile else ''}, batch 8",
            "batch_sizes": args.batch_sizes, "max_batch_wait_ms": args.max_batch_wait_ms,
            "latents_prepare_seconds": round(prepare_seconds, 2),
            "stream": "patch, acceleration off (every frame through the engine)",
        }  # fmt: skip
        results["batching"] = compare_batching(
            bundle, engine, speech.pcm, args.counts, args.seconds, tuple(args.batch_sizes),
            args.max_batch_wait_ms,
        )  # fmt: skip
    results["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    if args.device.startswith("cuda"):
        import torch

        results["gpu"] = torch.cuda.get_device_name()
        results["gpu_memory_peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    raise SystemExit(main())

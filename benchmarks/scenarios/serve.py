"""Live server over a real WebSocket: time to first frame, sustained fps, concurrent sessions, interrupt.

Starts `lipstream serve` (viseme engine) as a subprocess and measures from the client side. Full size (the
avatar's own size) and half size are measured in the same run so they can be compared side by side.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks serve --avatars-dir out/home/avatars
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import time
from pathlib import Path

import bench_common
import numpy as np
from rich.progress import Progress

from lipstream.server.protocol import Flags, Kind, decode_media

REPO = Path(__file__).resolve().parents[2]
TEXT = "Good evening. Here is the news, read by a face that was never filmed saying it."


def start_server(avatars_dir: Path) -> tuple[subprocess.Popen, str]:
    """`lipstream serve --port 0 --max-sessions 16`; returns the process and its ws URL."""
    args = ["--avatars-dir", str(avatars_dir), "--max-sessions", "16"]
    proc, http, _ = bench_common.start_server(args, cwd=REPO)
    return proc, http.replace("http://", "ws://", 1) + "/ws"


async def open_session(url: str, avatar: str, width: int | None) -> tuple[object, dict]:
    """Connect and get `ready`."""
    return await bench_common.open_session(url, avatar, output_width=width)


async def ttff_once(url: str, avatar: str, width: int | None) -> dict:
    """Speak once; ms from the request to the first speech frame received, and the interrupt ack time."""
    ws, _ = await open_session(url, avatar, width)
    for _ in range(10):  # let the idle stream settle
        await ws.recv()
    t0 = time.perf_counter()
    await ws.send(json.dumps({"type": "speak", "text": TEXT}))
    ttff = None
    while ttff is None:
        data = await ws.recv()
        if isinstance(data, bytes):
            msg = decode_media(data)
            if msg.kind == Kind.VIDEO and msg.flags & Flags.SPEAKING:
                ttff = (time.perf_counter() - t0) * 1000
    await asyncio.sleep(0.6)
    t1 = time.perf_counter()
    await ws.send(json.dumps({"type": "interrupt"}))
    last_speech_after = t1
    ack = None
    while ack is None:
        data = await ws.recv()
        if isinstance(data, bytes):
            if decode_media(data).flags & Flags.SPEAKING:
                last_speech_after = time.perf_counter()
        elif json.loads(data).get("interrupted"):
            ack = (time.perf_counter() - t1) * 1000
    await ws.close()
    return {
        "ttff_ms": ttff,
        "interrupt_ack_ms": ack,
        "speech_after_interrupt_ms": (last_speech_after - t1) * 1000,
    }


async def sustained(url: str, avatar: str, width: int | None, sessions: int, seconds: float) -> list[float]:
    """Each of `sessions` concurrent sessions speaks; the frame rate each receives once the lead is spent."""

    async def one() -> float:
        ws, _ = await open_session(url, avatar, width)
        await ws.send(json.dumps({"type": "speak", "text": TEXT + " " + TEXT}))
        times: list[float] = []
        end = time.perf_counter() + seconds + 2.0
        while time.perf_counter() < end:
            data = await ws.recv()
            if isinstance(data, bytes) and decode_media(data).kind == Kind.VIDEO:
                times.append(time.perf_counter())
        await ws.close()
        steady = [t for t in times if t >= times[0] + 2.0]  # skip the first 2 s (lead fill)
        return (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else 0.0

    return list(await asyncio.gather(*(one() for _ in range(sessions))))


def histogram(values: dict[str, list[float]], path: Path) -> None:
    """Latency histogram PNG of time to first frame per stream size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, vals in values.items():
        ax.hist(vals, bins=15, alpha=0.6, label=label)
    ax.axvline(300, color="red", linestyle="--", label="goal 300 ms")
    ax.set_xlabel("time to first speech frame at the client (ms)")
    ax.set_ylabel("requests")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    """Run every measurement and write JSON + PNG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--avatars-dir", type=Path, required=True)
    parser.add_argument("--avatar", default="sample")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--max-concurrent", type=int, default=4)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "serve_bench.json")
    args = parser.parse_args(argv)
    proc, url = start_server(args.avatars_dir)
    manifest = json.loads((args.avatars_dir / args.avatar / "manifest.json").read_text())
    full_w = manifest["width"]
    sizes = {
        f"full {full_w}x{manifest['height']}": None,
        f"half {full_w // 2}x{manifest['height'] // 2}": full_w // 2,
    }
    results: dict = {"avatar": args.avatar, "url": url, "sizes": {}}
    try:
        with Progress() as progress:
            for label, width in sizes.items():
                task = progress.add_task(label, total=args.requests + args.max_concurrent)
                runs = []
                for _ in range(args.requests):
                    runs.append(asyncio.run(ttff_once(url, args.avatar, width)))
                    progress.advance(task)
                conc = {}
                for n in range(1, args.max_concurrent + 1):
                    fps = asyncio.run(sustained(url, args.avatar, width, n, args.seconds))
                    conc[n] = {"fps_per_session": [round(f, 2) for f in fps], "min_fps": round(min(fps), 2)}
                    progress.advance(task)
                ttffs = [r["ttff_ms"] for r in runs]
                results["sizes"][label] = {
                    "ttff_ms": {"p50": float(np.median(ttffs)), "p95": float(np.percentile(ttffs, 95)),
                                "max": max(ttffs), "all": [round(v, 1) for v in ttffs]},
                    "interrupt_ack_ms_p50": float(np.median([r["interrupt_ack_ms"] for r in runs])),
                    "speech_frames_after_interrupt_ms_p50": float(
                        np.median([r["speech_after_interrupt_ms"] for r in runs])),
                    "sustained": conc,
                    "sessions_holding_25fps": max(
                        [n for n, c in conc.items() if c["min_fps"] >= 24.5], default=0),
                }  # fmt: skip
    finally:
        proc.terminate()
        proc.wait()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    histogram({k: v["ttff_ms"]["all"] for k, v in results["sizes"].items()}, args.out.with_suffix(".png"))
    for label, r in results["sizes"].items():
        print(
            f"{label}: ttff p50 {r['ttff_ms']['p50']:.0f} ms p95 {r['ttff_ms']['p95']:.0f} ms | "
            "interrupt ack "
            f"{r['interrupt_ack_ms_p50']:.0f} ms | sessions at 25 fps: {r['sessions_holding_25fps']} | "
            + ", ".join(f"{n}: {c['min_fps']}" for n, c in r["sustained"].items())
        )
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

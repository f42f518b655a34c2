"""Offline render speed (issue 3): a ~30 s speech clip on the 1080×1920 sample avatar, whole path.

Run: OMP_NUM_THREADS=2 .venv/bin/python -m benchmarks render [--avatar sample] [--repeats 2]
     [--qualities old,balanced] [--with-accel]

Measures `lipstream render`'s own path in-process (features + engine + compositor + H.264 + AAC + mux)
and reports realtime_factor and mean ms per frame by stage, once per `--quality` level named in
--qualities, interleaved in one run: "old" is the x264 setting before issue 11 (veryfast crf 20),
"balanced" the default since, so old and new render speed are side by side on the same machine (its
CPU model is printed and recorded). --with-accel adds runs with acceleration forced on at the default
quality. Also times the compositor's RGB path and
a naive full-frame composite (copy, paste the resized patch with a full-frame float blend, convert the
whole frame to I420) side by side, so the saving of the crop-only I420 path is a ratio from one run.
Writes benchmarks/results/render_bench.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
from bench_common import cpu_model, open_or_build_avatar

from lipstream.engines.registry import create_engine
from lipstream.render.accel import AccelConfig
from lipstream.render.compositor import Compositor
from lipstream.render.offline import DEFAULT_QUALITY, QUALITY_LEVELS, H264Settings, render_speech_to_mp4
from lipstream.talk.voices.tts import create_tts

RESULTS = Path(__file__).resolve().parents[1] / "results"
OLD = "old"
OLD_SETTINGS = H264Settings("veryfast", 20)  # what `lipstream render` used before issue 11

SCRIPT = (
    "Good evening, and welcome to the late edition. The city council met today and approved a new budget "
    "after a long debate. Schools will receive four percent more, and the harbour project moves ahead. "
    "In other news, the old bridge reopened this afternoon after three years of repairs. "
    "Thousands of people walked across it, and the mayor thanked the workers who rebuilt it. "
    "The weather turns colder this week, with rain on Thursday and a chance of snow on the hills. "
    "In sports, the home team won on Saturday, two goals to one, in front of a full stadium. "
    "That is all for tonight. Thank you for watching, and good night."
)


def naive_composite(bundle, index: int, patch: np.ndarray) -> np.ndarray:
    """The straightforward way: full-frame float blend and a full-frame colour conversion."""
    frame = np.array(bundle.frames[index], dtype=np.float32)
    x1, y1, x2, y2 = (int(v) for v in bundle.boxes[index])
    mask = cv2.resize(np.asarray(bundle.masks[index]), (x2 - x1, y2 - y1)).astype(np.float32)[..., None] / 255
    full_mask = np.zeros(frame.shape[:2] + (1,), np.float32)
    full_mask[y1:y2, x1:x2] = mask
    pasted = frame.copy()
    pasted[y1:y2, x1:x2] = cv2.resize(patch, (x2 - x1, y2 - y1)).astype(np.float32)
    out = (pasted * full_mask + frame * (1 - full_mask)).astype(np.uint8)
    return cv2.cvtColor(out, cv2.COLOR_RGB2YUV_I420)


def time_compositors(bundle, frames: int = 100) -> dict:
    """ms per frame: our I420 compositor vs the naive full-frame one, same patches, same run."""
    comp = Compositor(bundle)
    patch = np.random.default_rng(0).integers(0, 256, (256, 256, 3), dtype=np.uint8)
    comp.compose_i420(0, patch)  # builds the I420 cache once (prepare-time work, not per frame)
    ours, naive = [], []
    for k in range(frames):
        i = bundle.base_frame_index(k)
        t0 = time.perf_counter()
        comp.compose_i420(i, patch)
        t1 = time.perf_counter()
        naive_composite(bundle, i, patch)
        t2 = time.perf_counter()
        ours.append(t1 - t0)
        naive.append(t2 - t1)
    o, n = statistics.median(ours) * 1000, statistics.median(naive) * 1000
    return {"compositor_ms": round(o, 2), "naive_ms": round(n, 2), "speedup": round(n / o, 1)}


def render_cases(qualities: list[str], with_accel: bool) -> list[tuple[str, str, AccelConfig]]:
    """(label, quality, accel) of each render in one repeat; AccelConfig() is what `lipstream render` does."""
    cases = [(quality, quality, AccelConfig()) for quality in qualities]
    if with_accel:
        cases.append((f"{DEFAULT_QUALITY}+accel", DEFAULT_QUALITY, AccelConfig(enabled=True)))
    return cases


def print_table(runs: list[dict], cpu: str) -> None:
    """Markdown table of every run, side by side (as docs/benchmarks.md shows it)."""
    print(f"\nCPU: {cpu}, {os.cpu_count()} cpus")
    print("| run | x264 | realtime_factor | features | engine | compositor | encode (ms per frame) |")
    print("|---|---|---|---|---|---|---|")
    for r in runs:
        ms, enc = r["stage_ms"], r["encoder"]
        stages = " | ".join(f"{ms.get(k, 0.0):.2f}" for k in ("features", "engine", "compositor", "encode"))
        print(
            f"| {r['label']}, run {r['repeat'] + 1} | {enc['preset']} crf {enc['crf']} "
            f"| **{r['realtime_factor']:.2f}** | {stages} |"
        )


def best_factors(runs: list[dict]) -> dict[str, float]:
    """The best realtime_factor of each label over the repeats."""
    best: dict[str, float] = {}
    for r in runs:
        best[r["label"]] = max(best.get(r["label"], 0.0), r["realtime_factor"])
    return best


def main(argv: list[str] | None = None) -> int:
    """Render the clip and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--avatar", default="sample")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--voice", default="piper")
    parser.add_argument(
        "--qualities", default=f"{OLD},{DEFAULT_QUALITY}",
        help=f"comma-separated --quality levels to compare (of {', '.join(QUALITY_LEVELS)}, or {OLD}: "
        "veryfast crf 20, the setting before issue 11)",
    )
    parser.add_argument("--with-accel", action="store_true", help="also render with acceleration forced on")
    parser.add_argument("--out", type=Path, default=RESULTS / "render_bench.json")
    args = parser.parse_args(argv)
    qualities = [q.strip() for q in args.qualities.split(",") if q.strip()]
    unknown = [q for q in qualities if q not in QUALITY_LEVELS and q != OLD]
    if unknown:
        parser.error(f"unknown quality {', '.join(unknown)}; choose from {', '.join([*QUALITY_LEVELS, OLD])}")
    bundle = open_or_build_avatar(args.avatar)
    speech = create_tts(args.voice).synthesize(SCRIPT)
    engine = create_engine("viseme")
    engine.prepare(bundle)
    out_dir = Path(tempfile.mkdtemp(prefix="render-bench-"))
    load_before = os.getloadavg()[0]
    runs = []
    for r in range(args.repeats):
        # interleaved, so a change in the machine's load hits every setting alike
        for label, quality, accel in render_cases(qualities, args.with_accel):
            report = render_speech_to_mp4(
                bundle, engine, speech, out_dir / f"{label}{r}.mp4", accel=accel,
                quality=DEFAULT_QUALITY if quality == OLD else quality,
                encoder=OLD_SETTINGS if quality == OLD else None, persist_codebook=False,
            )
            size = (out_dir / f"{label}{r}.mp4").stat().st_size
            fields = report.model_dump(exclude={"output", "notes"})
            runs.append({"label": label, "repeat": r, "mp4_bytes": size, **fields})
            print(
                f"{label:16s} run {r}: {report.frames} frames, {report.audio_seconds:.1f} s audio, "
                f"{report.realtime_factor:.2f}x real time, {size / 1e6:.1f} MB, stage ms {report.stage_ms}"
            )
    cpu = cpu_model()
    print_table(runs, cpu)
    best = best_factors(runs)
    print("best realtime_factor: " + ", ".join(f"{k} {v:.2f}" for k, v in best.items()))
    comp = time_compositors(bundle)
    print(f"compositor {comp['compositor_ms']} ms/frame vs naive {comp['naive_ms']} ms ({comp['speedup']}x)")
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu_model": cpu,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "avatar": {"name": bundle.name, "size": list(bundle.size)},
        "audio_seconds": round(speech.seconds, 2),
        "runs": runs,
        "best_realtime_factor": best,
        "best_default_realtime_factor": best.get(DEFAULT_QUALITY),
        "compositor": comp,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

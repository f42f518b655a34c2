"""Offline render speed (issue 3): a ~30 s speech clip on the 1080×1920 sample avatar, whole path.

Run: .venv/bin/python benchmarks/render_bench.py [--avatar sample] [--repeats 2]

Measures `lipstream render`'s own path in-process (features + engine + compositor + H.264 + AAC + mux)
and reports realtime_factor and mean ms per frame by stage; also times the compositor's RGB path and
a naive full-frame composite (copy, paste the resized patch with a full-frame float blend, convert the
whole frame to I420) side by side, so the saving of the crop-only I420 path is a ratio from one run.
Writes benchmarks/results/render_bench.json.
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
from bench_common import open_or_build_avatar

from lipstream.engines.registry import create_engine
from lipstream.render.accel import AccelConfig
from lipstream.render.compositor import Compositor
from lipstream.render.offline import render_speech_to_mp4
from lipstream.talk.tts import create_tts

RESULTS = Path(__file__).resolve().parent / "results"

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


def main() -> None:
    """Render the clip and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--avatar", default="sample")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--voice", default="piper")
    args = parser.parse_args()
    bundle = open_or_build_avatar(args.avatar)
    speech = create_tts(args.voice).synthesize(SCRIPT)
    engine = create_engine("viseme")
    engine.prepare(bundle)
    out_dir = Path(tempfile.mkdtemp(prefix="render-bench-"))
    runs = []
    for r in range(args.repeats):
        # "default" is what `lipstream render` does (the viseme engine does not accelerate by default)
        for label, accel in (("default", AccelConfig()), ("accel", AccelConfig(enabled=True))):
            report = render_speech_to_mp4(
                bundle, engine, speech, out_dir / f"{label}{r}.mp4", accel=accel, persist_codebook=False
            )
            runs.append({"label": label, **report.model_dump(exclude={"output", "notes"})})
            print(
                f"{label:8s} run {r}: {report.frames} frames, {report.audio_seconds:.1f} s audio, "
                f"{report.realtime_factor:.2f}x real time, stage ms {report.stage_ms}"
            )
    comp = time_compositors(bundle)
    print(f"compositor {comp['compositor_ms']} ms/frame vs naive {comp['naive_ms']} ms ({comp['speedup']}x)")
    best = max((r for r in runs if r["label"] == "default"), key=lambda r: r["realtime_factor"])
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}",
        "avatar": {"name": bundle.name, "size": list(bundle.size)},
        "audio_seconds": round(speech.seconds, 2),
        "runs": runs,
        "best_default_realtime_factor": best["realtime_factor"],
        "compositor": comp,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "render_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {RESULTS / 'render_bench.json'}")


if __name__ == "__main__":
    main()

"""Acceleration figures (issue 6): engine passes per frame, quality cost, speed with and without.

Run: .venv/bin/python -m benchmarks accel [--avatar sample] [--engines viseme musetalk-tiny]

Seeds the codebook on one news-style clip, then renders a different clip of the same voice (Piper)
three ways side by side: accelerated without seeding, accelerated after seeding, and --no-accel.
Quality is compared on the composited pictures before H.264 (so codec noise does not blur the
comparison): mouth-rectangle PSNR against --no-accel, and the largest frame-to-frame change of the
mouth rectangle (a "pop" shows up there). Writes benchmarks/results/accel_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
from bench_common import open_or_build_avatar

from lipstream.audio.levels import SilenceDetector
from lipstream.engines.base import Engine, Speech
from lipstream.engines.registry import create_engine
from lipstream.render.accel import AccelConfig, PatchScheduler, codebook_path, load_codebook, utterance_frames
from lipstream.render.compositor import Compositor
from lipstream.render.offline import render_speech_to_mp4
from lipstream.render.seed import seed_codebook
from lipstream.talk.voices.tts import create_tts

RESULTS = Path(__file__).resolve().parents[1] / "results"

SEED_SCRIPT = (
    "Good evening. Our top story tonight: the city council has approved the new budget. "
    "Funding for schools rises by four percent, and the harbour project moves ahead. "
    "In sports, the home team won on Saturday, two goals to one, in front of a full stadium. "
    "The weather turns colder this week, with rain expected on Thursday and Friday. "
    "Now, a look at the markets, which closed slightly higher after a quiet day of trading."
)
TEST_SCRIPT = (
    "Welcome back. Tonight the old bridge reopened after three years of repairs. "
    "Thousands of people walked across it this afternoon, and the mayor thanked the workers. "
    "Traffic will return on Monday morning, but buses will keep the detour for another week. "
    "Elsewhere, the museum announced a new exhibition of maps, opening in the spring. "
    "Ticket prices stay the same, and children under twelve get in for free on weekends. "
    "Scientists at the university say the lake is cleaner than it has been in twenty years. "
    "That is all for now. Thank you for watching, and good night."
)


def mouth_frames(bundle, engine: Engine, speech: Speech, config: AccelConfig, codebook=None) -> tuple:
    """Composited mouth rectangles of every frame (RGB, before encoding), and the scheduler stats."""
    frames = utterance_frames(bundle, engine, speech, config, SilenceDetector())
    base_ids = frames.base_ids
    sched = PatchScheduler(bundle, engine, config, codebook)
    released = sched.push(frames.features, frames.skip, base_ids, list(range(len(base_ids)))) + sched.finish()
    comp = Compositor(bundle, engine.patch_size)
    crops = []
    for k, patch in released:
        geo = comp.geometry(int(base_ids[k]))
        x0, y0, x1, y1 = geo.rect
        crops.append((k, comp.compose(int(base_ids[k]), patch)[y0:y1, x0:x1].copy()))
    return crops, sched.stats


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two uint8 images (99 when identical)."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def max_step(crops: list) -> float:
    """Largest mean absolute change of the mouth rectangle between consecutive frames (same base size)."""
    steps = [
        float(np.mean(np.abs(a[1].astype(np.int16) - b[1].astype(np.int16))))
        for a, b in zip(crops, crops[1:], strict=False)
        if a[1].shape == b[1].shape
    ]
    return max(steps) if steps else 0.0


def bench_engine(
    name: str, engine: Engine, bundle, seed: Speech, test: Speech, out_dir: Path, quality: bool = True
) -> dict:
    """All figures for one engine on one avatar (quality=False: no PSNR, for random-weight models)."""
    engine.prepare(bundle)
    codebook_path(bundle, engine).unlink(missing_ok=True)
    result: dict = {"engine": name, "frames": test.frame_count, "test_seconds": round(test.seconds, 2)}
    full = None
    if quality:
        full, full_stats = mouth_frames(bundle, engine, test, AccelConfig(enabled=False))
        result["no_accel"] = {**full_stats.as_dict(), "max_step": round(max_step(full), 2)}
    cold, cold_stats = mouth_frames(bundle, engine, test, AccelConfig(enabled=True))
    seed_codebook(bundle, engine, [seed])
    book = load_codebook(bundle, engine, AccelConfig(enabled=True))
    seeded, seeded_stats = mouth_frames(bundle, engine, test, AccelConfig(enabled=True), book)
    for label, crops, stats in (("unseeded", cold, cold_stats), ("seeded", seeded, seeded_stats)):
        row = {**stats.as_dict(), "neural_ratio": round(stats.neural_frames / max(stats.frames, 1), 3)}
        if full is not None:
            values = np.array([psnr(a[1], b[1]) for a, b in zip(crops, full, strict=True)])
            changed = values[values < 99.0]  # frames that differ at all (silent frames are identical)
            row.update(
                psnr_mean_db=round(float(values.mean()), 2),
                psnr_changed_mean_db=round(float(changed.mean()), 2) if changed.size else None,
                psnr_min_db=round(float(values.min()), 2),
                max_step=round(max_step(crops), 2),
            )
        result[label] = row
    # whole renders (features + engine + compositor + H.264 + mux), side by side
    configs = (("render_accel", AccelConfig(enabled=True)), ("render_no_accel", AccelConfig(enabled=False)))
    for label, config in configs:
        report = render_speech_to_mp4(
            bundle, engine, test, out_dir / f"{name}-{label}.mp4", accel=config, persist_codebook=False
        )
        result[label] = {
            k: getattr(report, k)
            for k in ("realtime_factor", "wall_seconds", "ttff_ms", "neural_frames", "codebook_hits")
        }
    return result


def tiny_musetalk(models_dir: Path):
    """A same-topology MuseTalk engine at tiny widths (random weights), for counting on a CPU."""
    from lipstream.engines.musetalk.topology import write_model_folder

    write_model_folder(models_dir, versions=("1.5",))
    return create_engine(
        "musetalk", models_dir=str(models_dir), version="1.5", device="cpu", dtype="float32", batch_size=4
    )


def main(argv: list[str] | None = None) -> int:
    """Run and print the acceleration figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--avatar", default="sample", help="avatar name (built as the sample when missing)")
    parser.add_argument("--engines", nargs="+", default=["viseme", "musetalk-tiny"])
    args = parser.parse_args(argv)
    bundle = open_or_build_avatar(args.avatar)
    tts = create_tts("piper")
    seed, test = tts.synthesize(SEED_SCRIPT), tts.synthesize(TEST_SCRIPT)
    out_dir = Path(tempfile.mkdtemp(prefix="accel-bench-"))
    results = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "avatar": {"name": bundle.name, "size": list(bundle.size)},
        "seed_seconds": round(seed.seconds, 2),
        "engines": [],
    }
    for name in args.engines:
        if name == "viseme":
            row = bench_engine(name, create_engine("viseme"), bundle, seed, test, out_dir)
        else:  # random tiny weights: the counts are meaningful, the pictures are not
            tiny = tiny_musetalk(out_dir / "tiny-models")
            row = bench_engine(name, tiny, bundle, seed, test, out_dir, quality=False)
        results["engines"].append(row)
        print(f"\n== {name}: {row['frames']} frames ({row['test_seconds']} s)")
        for label in ("unseeded", "seeded"):
            r = row[label]
            line = (
                f"  {label:9s} neural {r['neural_frames']:4d} ({r['neural_ratio']:.2f} of frames), "
                f"keyframes {r['keyframes']}, codebook hits {r['codebook_hits']}"
            )
            if "psnr_mean_db" in r:
                line += (
                    f", PSNR {r['psnr_mean_db']:.1f} dB (changed frames {r['psnr_changed_mean_db']}, "
                    f"min {r['psnr_min_db']:.1f}), max step "
                    f"{r['max_step']:.2f} vs {row['no_accel']['max_step']:.2f} no-accel"
                )
            print(line)
        if "render_accel" in row:
            a, f = row["render_accel"], row["render_no_accel"]
            print(
                f"  render: accel {a['realtime_factor']:.2f}x real time (ttff {a['ttff_ms']:.0f} ms), "
                f"no-accel {f['realtime_factor']:.2f}x (ttff {f['ttff_ms']:.0f} ms)"
            )
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "accel_bench.json").write_text(json.dumps(results, indent=2) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    print(f"\nwrote {RESULTS / 'accel_bench.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

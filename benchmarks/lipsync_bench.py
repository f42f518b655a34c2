"""Viseme engine speed and lip-sync, side by side in one run.

Renders ~30 s of speech from text the model never saw onto an avatar, three ways:
  piper-audio   Piper voice (never used in training), audio-only features (the acoustic model)
  piper-text    the same speech with Piper's own phoneme timings
  espeak-text   espeak-ng with its phoneme timings
then measures each MP4 with `lipstream eval lipsync` (landmarks on the output frames only), and times
the engine hot path (features + render) per frame.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/lipsync_bench.py [--avatar NAME_OR_PATH] [--seconds 30]

Without --avatar it prepares the small 360x640 sample clip in a temp folder. Writes
benchmarks/results/lipsync_bench.json and one PNG plot per case.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.avatar.bundle import load_avatar
from lipstream.engines.base import Speech
from lipstream.engines.viseme.engine import VisemeEngine
from lipstream.evaluation.lipsync import measure_lipsync, plot_lipsync
from lipstream.render.offline import render_speech_to_mp4
from lipstream.talk.tts import create_tts

TEXT = (
    "Good evening. Tonight the harbour bridge reopened after three weeks of repairs, and the first cars "
    "crossed it shortly before midnight. The mayor thanked the workers, who finished ahead of schedule. "
    "In other news, the museum will keep its doors open late on Fridays through the summer. "
    "Temperatures stay mild tomorrow, with some rain in the morning. "
    "Finally, a small boat was found drifting near the old pier; nobody was on board. "
    "Police ask anyone who recognises it to call them. That is all for tonight. Thank you for watching."
)


def speech_of(voice: str, seconds: float) -> Speech:
    """The text spoken by a voice, cut at a frame boundary to at most `seconds`."""
    speech = create_tts(voice, fallback=False).synthesize(TEXT)
    n = min(len(speech.pcm), int(seconds * SAMPLE_RATE))
    phonemes = [p for p in speech.phonemes or [] if p.start < n]
    return Speech(speech.pcm[:n], phonemes=phonemes, text=speech.text, source=speech.source)


def hot_path_ms(engine: VisemeEngine, bundle, speech: Speech) -> dict:
    """Mean ms per frame of features and render (every frame rendered, batch of 8)."""
    t0 = time.perf_counter()
    feats = engine.features(speech)
    t1 = time.perf_counter()
    ids = np.array([bundle.base_frame_index(i) for i in range(len(feats))])
    for start in range(0, len(feats), engine.batch_size):
        engine.render(
            bundle, feats[start : start + engine.batch_size], ids[start : start + engine.batch_size]
        )
    t2 = time.perf_counter()
    n = max(len(feats), 1)
    return {
        "features_ms": (t1 - t0) * 1000 / n,
        "render_ms": (t2 - t1) * 1000 / n,
        "total_ms": (t2 - t0) * 1000 / n,
    }


def main() -> None:
    """Run every case, print a table, write JSON and plots."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--avatar", help="avatar name or bundle folder (default: small sample, prepared here)")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="lipsync_bench_"))
    if args.avatar:
        bundle = load_avatar(args.avatar)
    else:
        from lipstream.avatar.prepare import prepare_avatar
        from lipstream.avatar.sample import write_sample_video

        clip = work / "presenter.mp4"
        write_sample_video(clip, width=360, height=640, seconds=2.0, fps=25, seed=0)
        bundle = prepare_avatar(clip, "bench", avatars_root=work / "avatars", progress=False)
    piper = speech_of("piper", args.seconds)
    espeak = speech_of("espeak", args.seconds)
    cases = {
        "piper-audio": (VisemeEngine(use_phonemes=False), Speech(piper.pcm, source="piper audio only")),
        "piper-text": (VisemeEngine(), piper),
        "espeak-text": (VisemeEngine(), espeak),
    }
    results: dict = {
        "machine": f"{platform.machine()} {platform.processor() or ''} {platform.node()}".strip(),
        "avatar": {"name": bundle.name, "width": bundle.size[0], "height": bundle.size[1]},
        "cases": {},
    }
    for name, (engine, speech) in cases.items():
        engine.prepare(bundle)
        hot_path_ms(engine, bundle, speech)  # warm caches (crops mmap, FFT plans)
        speed = hot_path_ms(engine, bundle, speech)
        mp4 = work / f"{name}.mp4"
        render = render_speech_to_mp4(bundle, engine, speech, mp4)
        report, env, aperture, silent = measure_lipsync(mp4, progress=True)
        plot = args.out / f"lipsync_{name}.png"
        plot_lipsync(plot, report, env, aperture, silent)
        results["cases"][name] = {
            "audio_seconds": round(speech.seconds, 2),
            **{k: round(v, 3) for k, v in speed.items()},
            "render_realtime_factor": getattr(render, "realtime_factor", None),
            "lipsync": report.as_dict(),
            "plot": str(plot),
        }
        r = report
        print(
            f"{name:12s} {speech.seconds:5.1f}s  engine {speed['total_ms']:.2f} ms/frame "
            f"(features {speed['features_ms']:.2f}, render {speed['render_ms']:.2f})  "
            f"r={r.correlation_best:.3f} lag {r.best_lag_frames:+d} r0={r.correlation_lag0:.3f}  "
            f"silent closed {r.silent_closed_share}"
        )
    path = args.out / "lipsync_bench.json"
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""Viseme engine lip-sync and speed on the 1080x1920 sample avatar, every case side by side in one run.

Speech the engine was neither trained nor tuned on: a news bulletin (~30 s, with sentence pauses) that
appears in no training or tuning text, spoken by
  piper    the bundled Piper voice at length_scale 1.1 (training used 0.8 / 0.95 / 1.25)
  espeak   espeak-ng's en-gb-scotland voice (not one of the seven training voices)
and rendered two ways each:
  text     the TTS's own phoneme timings drive the mouth (what `lipstream render --text` does)
  audio    audio only, through the acoustic model with 200 ms look-ahead (`lipstream render --audio`)
Each MP4 is written by `render_speech_to_mp4` (the code behind `lipstream render`) twice: with the render's
default acceleration (keyframes, codebook, cross-fade infill; a fresh codebook per case) and with
`--no-accel` (every speaking frame from the engine), and measured by `measure_lipsync` (the code behind
`lipstream eval lipsync`: landmarks on the decoded output only).

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks lipsync            # ~6 min on 2 cores

Builds the sample avatar in a temp LIPSTREAM_HOME unless --avatar is given. Writes
benchmarks/results/lipsync_bench.json, lipsync_summary.png and one lipsync_<case>.png per case.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.avatar.bundle import AvatarBundle, load_avatar
from lipstream.engines.base import Speech
from lipstream.engines.viseme.engine import VisemeEngine
from lipstream.evaluation.lipsync import measure_lipsync, plot_lipsync
from lipstream.render.accel import AccelConfig
from lipstream.render.offline import render_speech_to_mp4

TEXT = (
    "Good evening. Tonight the harbour bridge reopened after three weeks of repairs, and the first cars "
    "crossed it shortly before midnight. The mayor thanked the workers, who finished ahead of schedule. "
    "In other news, the museum will keep its doors open late on Fridays through the summer. "
    "Temperatures stay mild tomorrow, with some rain in the morning. "
    "Finally, a small boat was found drifting near the old pier; nobody was on board. "
    "Police ask anyone who recognises it to call them. That is all for tonight. Thank you for watching."
)
PIPER_RATE = 1.1
ESPEAK_VOICE = "en-gb-scotland"
TARGET_CORRELATION = 0.6
TARGET_CLOSED = 0.9
TARGET_MS = 5.0


@dataclass(frozen=True)
class Case:
    """One rendered video: which speech and which feature path."""

    name: str
    voice: str
    use_phonemes: bool


CASES = (
    Case("piper-text", "piper", True),
    Case("piper-audio", "piper", False),
    Case("espeak-text", "espeak", True),
    Case("espeak-audio", "espeak", False),
)


def speech_of(voice: str, seconds: float) -> Speech:
    """The bulletin spoken by a held-out voice, cut to at most `seconds`."""
    from lipstream.talk.voices.espeak_tts import EspeakTTS
    from lipstream.talk.voices.piper_tts import PiperTTS

    tts = PiperTTS(length_scale=PIPER_RATE) if voice == "piper" else EspeakTTS(ESPEAK_VOICE)
    speech = tts.synthesize(TEXT)
    n = min(len(speech.pcm), int(seconds * SAMPLE_RATE))
    phonemes = [p for p in speech.phonemes or [] if p.start < n]
    return Speech(speech.pcm[:n], phonemes=phonemes, text=speech.text, source=speech.source)


def hot_path_ms(engine: VisemeEngine, bundle: AvatarBundle, speech: Speech) -> dict[str, float]:
    """Mean ms per frame of features and render (every frame rendered, in engine batches); wall clock, and
    this process's CPU time (what a busy machine's other jobs inflate least)."""
    t0, c0 = time.perf_counter(), time.process_time()
    feats = engine.features(speech)
    t1 = time.perf_counter()
    ids = np.array([bundle.base_frame_index(i) for i in range(len(feats))])
    for start in range(0, len(feats), engine.batch_size):
        stop = start + engine.batch_size
        engine.render(bundle, feats[start:stop], ids[start:stop])
    t2, c2 = time.perf_counter(), time.process_time()
    n = max(len(feats), 1)
    return {
        "features_ms": (t1 - t0) * 1000 / n,
        "render_ms": (t2 - t1) * 1000 / n,
        "total_ms": (t2 - t0) * 1000 / n,
        "total_cpu_ms": (c2 - c0) * 1000 / n,
    }


def sample_bundle(work: Path) -> AvatarBundle:
    """The `lipstream avatar sample` avatar (1080x1920), built in a temp folder."""
    from lipstream.avatar.sample import build_sample_avatar

    return build_sample_avatar("sample", avatars_root=work / "avatars", progress=True)


def plot_summary(path: Path, cases: dict) -> None:
    """Bar chart of correlation (best lag) and silent-closed share per case, with the targets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(cases)
    corr = [cases[n]["lipsync"]["correlation_best"] for n in names]
    closed = [cases[n]["lipsync"]["silent_closed_share"] or 0.0 for n in names]
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(12, 4.5), dpi=100)
    ax.bar(x - 0.2, corr, 0.4, label="envelope correlation (best lag)", color="tab:blue")
    ax.bar(x + 0.2, closed, 0.4, label="silent frames closed", color="tab:green")
    ax.axhline(TARGET_CORRELATION, color="tab:blue", ls=":", lw=1)
    ax.axhline(TARGET_CLOSED, color="tab:green", ls=":", lw=1)
    ax.set_xticks(x, names, rotation=20, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_title("viseme engine on the 1080x1920 sample, held-out speech (dotted: targets)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run every case, print a table, write JSON and plots."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--avatar", help="avatar name or bundle folder (default: the sample, built here)")
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="lipsync_bench_"))
    bundle = load_avatar(args.avatar) if args.avatar else sample_bundle(work)
    speeches = {voice: speech_of(voice, args.seconds) for voice in ("piper", "espeak")}
    results: dict = {
        "machine": f"{platform.machine()} {platform.processor() or ''} {platform.node()}".strip(),
        "avatar": {"name": bundle.name, "width": bundle.size[0], "height": bundle.size[1]},
        "speech": {"text_chars": len(TEXT), "piper_length_scale": PIPER_RATE, "espeak_voice": ESPEAK_VOICE},
        "targets": {
            "correlation": TARGET_CORRELATION,
            "silent_closed": TARGET_CLOSED,
            "engine_ms": TARGET_MS,
        },
        "cases": {},
    }
    columns = ("audio", "engine ms", "r best", "lag", "r lag0", "r speech", "closed")
    print(f"{'case':19s} " + " ".join(f"{c:>{max(len(c), 6)}s}" for c in columns))
    for case, accelerated in ((c, a) for c in CASES for a in (False, True)):
        speech = speeches[case.voice]
        if not case.use_phonemes:
            speech = Speech(speech.pcm, source=f"{case.voice} audio only")
        engine = VisemeEngine(use_phonemes=case.use_phonemes)
        engine.prepare(bundle)
        hot_path_ms(engine, bundle, speech)  # warm caches (crops mmap, FFT plans)
        speed = hot_path_ms(engine, bundle, speech)
        name = f"{case.name}{'+accel' if accelerated else ''}"
        mp4 = work / f"{name}.mp4"
        render = render_speech_to_mp4(
            bundle, engine, speech, mp4, accel=AccelConfig(enabled=accelerated), persist_codebook=False
        )
        report, env, aperture, silent = measure_lipsync(mp4, progress=True)
        plot = args.out / f"lipsync_{name}.png"
        plot_lipsync(plot, report, env, aperture, silent)
        results["cases"][name] = {
            "voice": case.voice,
            "render_accel": accelerated,
            "keyframes": render.keyframes,
            "codebook_hits": render.codebook_hits,
            "features": "phoneme timings" if case.use_phonemes else "audio only",
            "audio_seconds": round(speech.seconds, 2),
            "lookahead_ms": engine.lookahead_frames * 40 if not case.use_phonemes else None,
            **{k: round(v, 3) for k, v in speed.items()},
            "render_realtime_factor": render.realtime_factor,
            "lipsync": report.as_dict(),
            "plot": str(plot),
        }
        closed = "n/a" if report.silent_closed_share is None else f"{report.silent_closed_share:.1%}"
        print(
            f"{name:19s} {speech.seconds:5.1f}s {speed['total_ms']:9.2f} {report.correlation_best:6.3f} "
            f"{report.best_lag_frames:+6d} {report.correlation_lag0:6.3f} "
            f"{report.correlation_speech_lag0:8.3f} {closed:>6s}",
            flush=True,
        )
    plot_summary(args.out / "lipsync_summary.png", results["cases"])
    path = args.out / "lipsync_bench.json"
    path.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {path} and {args.out / 'lipsync_summary.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Weight-free engine speed (issue 22: ≤ 2 ms a frame), of the lipstream this process imports.

Renders every frame of held-out speech (Piper 1.1, phoneme timings) on the 1080×1920 sample avatar, in engine
batches, after a warm-up pass: --rounds rounds of --passes passes. Reported per frame: wall ms and the
process's CPU ms (features + render), each round's median and the median over rounds.

    OMP_NUM_THREADS=1 LIPSTREAM_HOME=… .venv/bin/python -m benchmarks viseme_speed

Two trees side by side (this checkout's script on both, each with its own lipstream):

    .venv/bin/python -m benchmarks before_after --before REV -- viseme_speed

Writes benchmarks/results/viseme_speed_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
TEXT = (
    "Good evening. Tonight the harbour bridge reopened after three weeks of repairs, and the first cars "
    "crossed it shortly before midnight. The mayor thanked the workers, who finished ahead of schedule."
)


def piper_voice():
    """The held-out Piper voice (length scale 1.1) of whichever lipstream is imported (its older home too)."""
    try:
        from lipstream.talk.voices.piper_tts import PiperTTS
    except ImportError:  # a tree from before talk/ had rooms
        from lipstream.talk.piper_tts import PiperTTS  # type: ignore[no-redef]
    return PiperTTS(length_scale=1.1)


def held_out_speech(path: Path) -> Path:
    """TEXT in the held-out Piper voice, saved as an .npz any checkout's engine can read (pcm and timings)."""
    from benchmarks.scenarios.realism_measure import save_speech

    save_speech(piper_voice().synthesize(TEXT), path)
    return path


def load_speech(path: Path):
    """The Speech saved by held_out_speech."""
    import numpy as np

    from lipstream.audio.speech import PhonemeTiming
    from lipstream.engines.base import Speech

    z = np.load(path)
    phonemes = [
        PhonemeTiming(str(p), int(s), int(e)) for p, s, e in zip(z["ph"], z["start"], z["end"], strict=True)
    ]
    return Speech(z["pcm"], phonemes=phonemes, text=str(z["text"]))


def main(argv: list[str] | None = None) -> int:
    """Render the speech round after round and write the medians."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--avatar", default="sample", help="prepared avatar in $LIPSTREAM_HOME")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", type=int, default=2, help="timed passes over the speech per round")
    ap.add_argument("--out", type=Path, default=RESULTS / "viseme_speed_bench.json")
    args = ap.parse_args(argv)
    sys.path.append(str(REPO / "benchmarks"))  # the helpers, by bare name (after PYTHONPATH's lipstream)
    from bench_common import cpu_model, open_or_build_avatar
    from siblings import scenario_module

    import lipstream
    from lipstream.engines.viseme.engine import VisemeEngine

    hot_path_ms = scenario_module("lipsync").hot_path_ms
    load_start = os.getloadavg()
    speech = load_speech(held_out_speech(Path(tempfile.mkdtemp(prefix="viseme-speed-")) / "piper.npz"))
    bundle = open_or_build_avatar(args.avatar)
    engine = VisemeEngine()
    engine.prepare(bundle)
    hot_path_ms(engine, bundle, speech)  # warm caches
    rounds = []
    for r in range(args.rounds):
        runs = [hot_path_ms(engine, bundle, speech) for _ in range(args.passes)]
        rounds.append({k: statistics.median(run[k] for run in runs) for k in runs[0]})
        print(f"round {r + 1}: {rounds[-1]}", flush=True)
    median = {k: round(statistics.median(x[k] for x in rounds), 3) for k in rounds[0]}
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "load_average_start": [round(v, 2) for v in load_start],
        "load_average_end": [round(v, 2) for v in os.getloadavg()],
        "lipstream": str(Path(lipstream.__file__).resolve().parent.parent),
        "avatar": args.avatar,
        "rounds": rounds,
        "median": median,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\n{cpu_model()}, load {result['load_average_start']} -> {result['load_average_end']}")
    for k, v in median.items():
        print(f"{k:14s} {v:.3f} ms per frame")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

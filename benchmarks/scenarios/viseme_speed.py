"""Weight-free engine speed, before and after, side by side in one run (issue 22: ≤ 2 ms a frame).

Each side renders every frame of the same held-out speech (Piper 1.1, phoneme timings) on the 1080×1920 sample
avatar in its own subprocess (PYTHONPATH = that checkout), in engine batches, after a warm-up pass; the sides
alternate for --rounds rounds. Reported per frame: wall ms and the process's CPU ms (features + render), the
median over rounds, and after / before.

    OMP_NUM_THREADS=1 LIPSTREAM_HOME=… .venv/bin/python -m benchmarks viseme_speed --before 4c0f546

Writes benchmarks/results/viseme_speed_bench.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
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


def side(speech: Path, avatar: Path, passes: int) -> None:
    """Runs inside one checkout: print {features_ms, render_ms, total_ms, total_cpu_ms} as JSON."""
    import numpy as np

    from lipstream.audio.speech import PhonemeTiming
    from lipstream.avatar.bundle import load_avatar
    from lipstream.engines.base import Speech
    from lipstream.engines.viseme.engine import VisemeEngine

    sys.path.insert(0, str(REPO / "benchmarks"))  # the helpers, by bare name
    from siblings import scenario_module

    hot_path_ms = scenario_module("lipsync").hot_path_ms

    z = np.load(speech)
    phonemes = [
        PhonemeTiming(str(p), int(s), int(e)) for p, s, e in zip(z["ph"], z["start"], z["end"], strict=True)
    ]
    utterance = Speech(z["pcm"], phonemes=phonemes, text=str(z["text"]))
    bundle = load_avatar(avatar)
    engine = VisemeEngine()
    engine.prepare(bundle)
    hot_path_ms(engine, bundle, utterance)  # warm caches
    runs = [hot_path_ms(engine, bundle, utterance) for _ in range(passes)]
    print(json.dumps({k: statistics.median(r[k] for r in runs) for k in runs[0]}))


def speech_sides(before_commit: str, avatar_name: str, prefix: str) -> tuple[Path, Path, Path]:
    """(a worktree of `before_commit`, the prepared avatar's folder, a work folder holding piper.npz: TEXT
    in the held-out Piper voice) for a before/after run of the engine on both checkouts."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from before_after import before_tree
    from bench_common import open_or_build_avatar

    from benchmarks.scenarios.realism_measure import save_speech
    from lipstream.talk.voices.piper_tts import PiperTTS

    before = before_tree(before_commit)  # a worktree of that commit, made once
    avatar = Path(open_or_build_avatar(avatar_name).path)
    work = Path(tempfile.mkdtemp(prefix=prefix))
    save_speech(PiperTTS(length_scale=1.1).synthesize(TEXT), work / "piper.npz")
    return before, avatar, work


def main(argv: list[str] | None = None) -> int:
    """Render on both checkouts, alternating, and print the figures side by side."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="4c0f546", help="commit of the 'before' engine")
    ap.add_argument("--avatar", default="sample", help="prepared avatar in $LIPSTREAM_HOME")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", type=int, default=2, help="timed passes over the speech per round")
    ap.add_argument("--out", type=Path, default=RESULTS / "viseme_speed_bench.json")
    ap.add_argument("--side", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.side:
        side(Path(args.side[0]), Path(args.side[1]), int(args.side[2]))
        return 0
    before, avatar, work = speech_sides(args.before, args.avatar, "viseme-speed-")
    from bench_common import cpu_model  # importable once speech_sides has put benchmarks/ on the path
    load_start = os.getloadavg()
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    for r in range(args.rounds):
        order = ("before", "after") if r % 2 == 0 else ("after", "before")
        for name in order:
            checkout = before if name == "before" else REPO
            env = {**os.environ, "PYTHONPATH": str(checkout)}
            done = subprocess.run(
                [sys.executable, str(Path(__file__).resolve()), "--side", str(work / "piper.npz"),
                 str(avatar), str(args.passes)],
                env=env, capture_output=True, text=True, check=True,
            )  # fmt: skip
            runs[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {name}: {runs[name][-1]}", flush=True)
    summary = {
        name: {k: round(statistics.median(x[k] for x in rs), 3) for k in rs[0]} for name, rs in runs.items()
    }
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "load_average_start": [round(v, 2) for v in load_start],
        "load_average_end": [round(v, 2) for v in os.getloadavg()],
        "before_commit": args.before,
        "avatar": args.avatar,
        "rounds": runs,
        "median": summary,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"\n{cpu_model()}, load {result['load_average_start']} -> {result['load_average_end']}")
    print("| figure (ms per frame) | before | after | after / before |")
    print("|---|---|---|---|")
    for k in summary["after"]:
        b, a = summary["before"][k], summary["after"][k]
        print(f"| {k} | {b:.2f} | {a:.2f} | {a / b:.2f} |")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

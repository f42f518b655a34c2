"""`speak` -> first speech frame shown in the player page, by the first sentence's length (issue 48).

The first frame waited for the whole first sentence's synthesis (255 -> 1,126 ms from 2 to 22 words on an
Intel Xeon); every text path now starts from a short first phrase. One `lipstream serve` process, the page in
headless Chromium, whole-frame and patch stream modes; each text is spoken `--repeats` times (interrupted
once its first speech frame is shown), the lengths interleaved so a slow spell of the shared machine falls
on all of them.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks first_frame --avatars-dir $LIPSTREAM_HOME/avatars
    .venv/bin/python -m benchmarks before_after --before REV -- first_frame \
        --avatars-dir $LIPSTREAM_HOME/avatars
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from pathlib import Path

import bench_common
from bench_common import cpu_model

REPO = Path(__file__).resolve().parent.parent
BROWSER_DIR = REPO / "tests" / "browser"
RESULTS = REPO / "benchmarks" / "results"
# first sentences of 2 to 25 words, each followed by a second one (the rest of a speak request)
FIRST_SENTENCES = {
    2: "Good evening.",
    5: "Welcome to the evening news.",
    9: "The weather along the coast will stay dry tonight.",
    15: "The bridge across the river opened to traffic this morning after three years of work.",
    22: "Tonight we look at the weather along the coast where strong winds are expected to ease by the "
    "morning after the storm.",
    25: "The museum on the hill will open late on Fridays this summer with live music in the garden and free "
    "entry for children under twelve.",
}
SECOND_SENTENCE = " That is all for tonight, and thank you for watching."


def drive(options: dict) -> dict:
    """One run of tests/browser/first_frame.mjs."""
    done = subprocess.run(["node", "first_frame.mjs", json.dumps(options)], cwd=BROWSER_DIR,
                          capture_output=True, text=True, timeout=900)  # fmt: skip
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if not lines:
        raise RuntimeError(f"first_frame.mjs printed no result: {done.stderr[-2000:]}")
    return json.loads(lines[-1])


def summary(values: list[float]) -> dict:
    """p50 and max of a list of milliseconds, and the values."""
    return {"p50": round(statistics.median(values), 1), "max": round(max(values), 1),
            "all": [round(v, 1) for v in values]}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Measure both stream modes and write the raw JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--avatars-dir", type=Path, required=True)
    parser.add_argument("--avatar", default="sample")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--words", type=int, nargs="+", default=sorted(FIRST_SENTENCES))
    parser.add_argument("--modes", nargs="+", default=["full", "patch"])
    parser.add_argument("--out", type=Path, default=RESULTS / "first_frame_bench.json")
    args = parser.parse_args(argv)
    texts = [FIRST_SENTENCES[n] + SECOND_SENTENCE for n in args.words]
    proc, url, _ = bench_common.start_server(["--avatars-dir", str(args.avatars_dir)], cwd=REPO)
    results: dict = {"cpu": cpu_model(), "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
                     "words": args.words, "repeats": args.repeats, "modes": {}}  # fmt: skip
    try:
        for mode in args.modes:
            run = drive({"url": url, "avatar": args.avatar, "stream": mode, "texts": texts,
                         "repeats": args.repeats})  # fmt: skip
            if run.get("failed"):
                raise RuntimeError(f"{mode}: {run['failed']} {run.get('problems')}")
            by_words = {str(n): summary(ms) for n, ms in zip(args.words, run["runs"], strict=True)}
            every = [v for ms in run["runs"] for v in ms]
            results["modes"][mode] = {"stream": run.get("stream"), **summary(every), "by_words": by_words,
                                      "problems": run.get("problems", [])}  # fmt: skip
            cells = " | ".join(f"{n} words {s['p50']:.0f}/{s['max']:.0f}" for n, s in by_words.items())
            print(f"{mode}: speak -> first speech frame shown p50/max ms: {cells} | all p50 "
                  f"{results['modes'][mode]['p50']:.0f} max {results['modes'][mode]['max']:.0f}")  # fmt: skip
    finally:
        proc.terminate()
        proc.wait()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

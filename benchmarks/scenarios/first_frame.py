"""`speak` -> first speech frame shown in the player page, by the first sentence's length (issue 48).

The first frame waited for the whole first sentence's synthesis (255 -> 1,126 ms from 2 to 22 words on an
Intel Xeon); every text path now starts from a short first phrase. One `lipstream serve` process, the page in
headless Chromium, whole-frame and patch stream modes; each text is spoken `--repeats` times (interrupted
once its first speech frame is shown), the lengths interleaved so a slow spell of the shared machine falls
on all of them.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks first_frame --avatars-dir $LIPSTREAM_HOME/avatars
    .venv/bin/python -m benchmarks first_frame --avatars-dir $LIPSTREAM_HOME/avatars --stages  # where it goes
    .venv/bin/python -m benchmarks before_after --before REV -- first_frame \
        --avatars-dir $LIPSTREAM_HOME/avatars
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

import bench_common
from bench_common import cpu_model

REPO = Path(__file__).resolve().parents[2]
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
# the server's marks (first_frame_trace.py, ms from the speak message's arrival) and the page's
# (first-speech.js, ms from the click), in the order they happen
SERVER_STAGES = ["cut", "synthesised", "features", "taken", "made", "sent"]
SERVER_FIGURES = ["first_words", "encode_ms", "first_key_bytes", "lead_ms"]
PAGE_STAGES = ["received", "audioReceived", "decoded", "scheduled", "due", "shown"]


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


def stage_medians(server: list[dict], page: list[dict]) -> dict:
    """Median of each stage's mark over a mode's speaks (None where a mark never came), and the re-anchors."""

    def median(rows: list[dict], key: str) -> float | None:
        values = [row[key] for row in rows if row.get(key) is not None]
        return round(statistics.median(values), 1) if values else None

    return {"server": {k: median(server, k) for k in SERVER_STAGES + SERVER_FIGURES},
            "page": {k: median(page, k) for k in PAGE_STAGES},
            "reanchored": sum(1 for row in page if row.get("reanchored")), "speaks": len(page),
            "audio_late": sum(row.get("audioLate") or 0 for row in page)}  # fmt: skip


def read_trace(path: Path | None, skip: int) -> list[dict]:
    """The server's trace lines after the first `skip` (one per speak)."""
    if path is None or not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()[skip:] if line.strip()]


def main(argv: list[str] | None = None) -> int:
    """Measure both stream modes and write the raw JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--avatars-dir", type=Path, required=True)
    parser.add_argument("--avatar", default="sample")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--words", type=int, nargs="+", default=sorted(FIRST_SENTENCES))
    parser.add_argument("--modes", nargs="+", default=["full", "patch"])
    parser.add_argument("--out", type=Path, default=RESULTS / "first_frame_bench.json")
    parser.add_argument("--stages", action="store_true",
                        help="also mark the server's stages (first_frame_trace.py wraps it)")  # fmt: skip
    args = parser.parse_args(argv)
    texts = [FIRST_SENTENCES[n] + SECOND_SENTENCE for n in args.words]
    env, launcher, trace = None, None, None
    if args.stages:
        trace = Path(tempfile.mkstemp(suffix=".jsonl")[1])
        env = {**os.environ, "FIRST_FRAME_TRACE": str(trace)}
        launcher = [sys.executable, str(REPO / "benchmarks" / "scenarios" / "first_frame_trace.py")]
    # one server process when traced: the wrapped functions live in it (the page's session is in one anyway)
    serve = ["--avatars-dir", str(args.avatars_dir), *(["--workers", "1"] if args.stages else [])]
    proc, url, _ = bench_common.start_server(serve, cwd=REPO, env=env, launcher=launcher)
    results: dict = {"cpu": cpu_model(), "cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"),
                     "words": args.words, "repeats": args.repeats, "modes": {}}  # fmt: skip
    try:
        for mode in args.modes:
            traced = len(read_trace(trace, 0))
            run = drive({"url": url, "avatar": args.avatar, "stream": mode, "texts": texts,
                         "repeats": args.repeats})  # fmt: skip
            if run.get("failed"):
                raise RuntimeError(f"{mode}: {run['failed']} {run.get('problems')}")
            by_words = {str(n): summary(ms) for n, ms in zip(args.words, run["runs"], strict=True)}
            every = [v for ms in run["runs"] for v in ms]
            results["modes"][mode] = {"stream": run.get("stream"), **summary(every), "by_words": by_words,
                                      "av_offset_ms": run.get("avOffsetMs"),
                                      "problems": run.get("problems", [])}  # fmt: skip
            if args.stages:
                server_rows, page_rows = read_trace(trace, traced), run.get("stages", [])
                stages = stage_medians(server_rows, page_rows)
                results["modes"][mode]["stages"] = stages
                # each speak's marks side by side, to see which stage grows with the sentence
                results["modes"][mode]["speaks"] = [{"server": s, "page": p}
                                                    for s, p in zip(server_rows, page_rows, strict=False)]
                print(f"{mode} stages (median ms): server {stages['server']} | page {stages['page']} | "
                      f"re-anchored {stages['reanchored']} of {stages['speaks']}, audio re-anchors "
                      f"{stages['audio_late']}")  # fmt: skip
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

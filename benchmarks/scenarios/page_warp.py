"""The page's weight-free warp (web/edge/viseme/warp.js) in Node, before and after, alternating in one run.

Both checkouts' warp.js render the same open-mouth rows (ah, ee, oo, a small opening, a closure, f/v) on the
sample avatar's crop with this checkout's avatar warp config; ms per patch, median over rounds, and after /
before, and whether both drew the same patches (a sha256 of them all). (The whole
page's figure, frames dropped at 1080×1920, is benchmarks/scenarios/serverless_page.py.)

    .venv/bin/python -m benchmarks page_warp --before 4c0f546

Writes benchmarks/results/js_warp_bench.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
WARP_JS = Path("lipstream/web/edge/viseme/warp.js")
ROWS = [
    [0.2, 0.1, 0, 0],
    [0.5, 0.3, 0, 0],
    [0.8, 0.05, 0, 0],
    [0.4, -0.6, 0, 0],
    [0.1, 0, 0, 0],
    [0.6, 0.6, 0, 0],
    [0.5, 0.2, 0.4, 0],  # a closure on its way
    [0.3, 0, 0, 0.8],  # f/v
]


def main(argv: list[str] | None = None) -> int:
    """Write the crop and rows once, then time both checkouts' warp.js in turn."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="4c0f546", help="commit of the 'before' warp.js")
    ap.add_argument("--avatar", default="sample", help="prepared avatar in $LIPSTREAM_HOME")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", type=int, default=100)
    ap.add_argument("--out", type=Path, default=RESULTS / "js_warp_bench.json")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(REPO / "benchmarks"))
    from before_after import before_tree
    from bench_common import cpu_model, open_or_build_avatar

    from lipstream.engines.viseme.engine import VisemeEngine

    before = before_tree(args.before)  # a worktree of that commit, made once
    bundle = open_or_build_avatar(args.avatar)
    engine = VisemeEngine()
    cache = engine._cache(bundle)
    work = Path(tempfile.mkdtemp(prefix="js-warp-"))
    crop, mask = np.asarray(cache.crops[0]), np.asarray(bundle.masks[0])
    np.concatenate([crop, mask[..., None]], axis=2).astype(np.uint8).tofile(work / "crop.rgba")
    opts = {
        "crop": str(work / "crop.rgba"), "size": int(crop.shape[0]), "geometry": cache.geometry[0].tolist(),
        "rows": ROWS, "cfg": dataclasses.asdict(engine.avatar_warp(bundle)), "passes": args.passes,
    }  # fmt: skip
    (work / "opts.json").write_text(json.dumps(opts))
    load_start = os.getloadavg()
    runs: dict[str, list[float]] = {"before": [], "after": []}
    digests: dict[str, set[str]] = {"before": set(), "after": set()}
    for r in range(args.rounds):
        for name in ("before", "after") if r % 2 == 0 else ("after", "before"):
            tree = before if name == "before" else REPO
            done = subprocess.run(
                ["node", str(REPO / "benchmarks" / "scenarios" / "page_warp.mjs"), str(tree / WARP_JS),
                 str(work / "opts.json")],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            answer = json.loads(done.stdout)
            runs[name].append(answer["ms_per_patch"])
            digests[name].add(answer["digest"])
            print(f"round {r + 1} {name}: {runs[name][-1]:.2f} ms per patch", flush=True)
    median = {name: round(statistics.median(v), 3) for name, v in runs.items()}
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "cpu_model": cpu_model(), "cpus": os.cpu_count(),
        "load_average_start": [round(v, 2) for v in load_start],
        "load_average_end": [round(v, 2) for v in os.getloadavg()],
        "before_commit": args.before, "rows": ROWS, "runs": runs, "median_ms_per_patch": median,
        "after_over_before": round(median["after"] / median["before"], 2),
        "same_patches": digests["before"] == digests["after"] and len(digests["after"]) == 1,
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"{cpu_model()}: before {median['before']:.2f} ms, after {median['after']:.2f} ms per patch "
          f"(x{result['after_over_before']}), same patches: {result['same_patches']}")  # fmt: skip
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The page's weight-free warp (web/edge/viseme/warp.js) in Node, of the tree whose lipstream this imports.

That tree's warp.js renders open-mouth rows (ah, ee, oo, a small opening, a closure, f/v) on the sample
avatar's crop with the tree's avatar warp config: ms per patch, median over rounds, and a sha256 of every
row's patch (`patch_digest`: two trees that draw the same patches print the same). (The whole page's figure,
frames dropped at 1080×1920, is benchmarks/scenarios/serverless_page.py.)

    .venv/bin/python -m benchmarks page_warp

Two trees side by side (this checkout's script on both; before_after says whether the digests agree):

    .venv/bin/python -m benchmarks before_after --before REV -- page_warp

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
    """Write the crop and rows once, then time the tree's warp.js round after round."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--avatar", default="sample", help="prepared avatar in $LIPSTREAM_HOME")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--passes", type=int, default=100)
    ap.add_argument("--out", type=Path, default=RESULTS / "js_warp_bench.json")
    args = ap.parse_args(argv)
    sys.path.append(str(REPO / "benchmarks"))  # the helpers, by bare name (after PYTHONPATH's lipstream)
    from bench_common import cpu_model, open_or_build_avatar

    import lipstream
    from lipstream.engines.viseme.engine import VisemeEngine

    tree = Path(lipstream.__file__).resolve().parent.parent  # the warp.js measured is this tree's
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
    runs: list[float] = []
    digests: set[str] = set()
    for r in range(args.rounds):
        done = subprocess.run(
            ["node", str(REPO / "benchmarks" / "scenarios" / "page_warp.mjs"), str(tree / WARP_JS),
             str(work / "opts.json")],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        answer = json.loads(done.stdout)
        runs.append(answer["ms_per_patch"])
        digests.add(answer["digest"])
        print(f"round {r + 1}: {runs[-1]:.2f} ms per patch", flush=True)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "cpu_model": cpu_model(), "cpus": os.cpu_count(),
        "load_average_start": [round(v, 2) for v in load_start],
        "load_average_end": [round(v, 2) for v in os.getloadavg()],
        "lipstream": str(tree), "rows": ROWS, "runs": runs,
        "median_ms_per_patch": round(statistics.median(runs), 3),
        "patch_digest": digests.pop() if len(digests) == 1 else "not the same in every round",
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    median, digest = result["median_ms_per_patch"], result["patch_digest"]
    print(f"{cpu_model()}: {median:.2f} ms per patch; patches {digest}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

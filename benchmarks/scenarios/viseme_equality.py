"""The weight-free engine draws the same patches as another commit's (issue 22 speed: faster, same picture).

A two-tree check, not a figure: `before_after` compares numbers, and two trees' patches are equal or not
pixel by pixel, within rounding. The other tree is a worktree of --before made by before_after's
`before_tree` (the same helper, so the two tools share their worktrees).

Each side renders, in its own subprocess (PYTHONPATH = that checkout), every frame of viseme_speed's
speech on the 1080×1920 sample avatar through `VisemeEngine.render`, in engine batches, plus --random rows of
random articulation (open, width ±1, closure, f/v: cues the bench's speech rarely or never holds) on random
shown frames; then the patches are compared pixel by pixel. Passes when the max abs difference is ≤ 1 (uint8
rounding) and the mean ≤ 0.05 on every set.

    OMP_NUM_THREADS=1 LIPSTREAM_HOME=… .venv/bin/python -m benchmarks viseme_equality --before REV

REV must run in this environment (a checkout from 693b886 on: the face tracker in its own environment).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
MAX_ABS = 1
MEAN_ABS = 0.05


def side(speech: Path, avatar: Path, rows: Path, out: Path) -> None:
    """Runs inside one checkout: save the speech's patches and the random rows' patches to `out` (npz)."""
    from lipstream.audio.speech import PhonemeTiming
    from lipstream.avatar.bundle import load_avatar
    from lipstream.engines.base import Speech
    from lipstream.engines.viseme.engine import VisemeEngine

    z = np.load(speech)
    phonemes = [
        PhonemeTiming(str(p), int(s), int(e)) for p, s, e in zip(z["ph"], z["start"], z["end"], strict=True)
    ]
    bundle = load_avatar(avatar)
    engine = VisemeEngine()
    engine.prepare(bundle)
    feats = engine.features(Speech(z["pcm"], phonemes=phonemes, text=str(z["text"])))
    ids = np.array([bundle.base_frame_index(i) for i in range(len(feats))])
    r = np.load(rows)
    shown = np.asarray(bundle.display_frames)
    picks = shown[r["picks"] % len(shown)]
    np.savez(
        out,
        speech=_render_all(engine, bundle, feats, ids),
        random=_render_all(engine, bundle, r["features"], picks),
    )


def _render_all(engine, bundle, feats: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Every row's patch, rendered in engine batches as the bench does."""
    parts = [
        engine.render(bundle, feats[a : a + engine.batch_size], ids[a : a + engine.batch_size])
        for a in range(0, len(feats), engine.batch_size)
    ]
    return np.concatenate(parts)


def random_rows(count: int, seed: int = 22) -> dict[str, np.ndarray]:
    """Random articulation rows (a quarter of them silent in one cue or all) and random frame picks."""
    rng = np.random.default_rng(seed)
    feats = np.stack(
        [
            rng.uniform(0, 1.2, count),
            rng.uniform(-1, 1, count),
            rng.uniform(0, 1, count),
            rng.uniform(0, 1, count),
        ],
        axis=1,
    ).astype(np.float32)
    feats[rng.random((count, 4)) < 0.25] = 0.0
    return {"features": feats, "picks": rng.integers(0, 1 << 30, count)}


def compare(before: np.ndarray, after: np.ndarray) -> dict:
    """Max and mean abs difference over all patches, the worst frame's, and how many frames differ at all."""
    diff = np.abs(before.astype(np.int16) - after.astype(np.int16))
    per_frame = diff.reshape(len(diff), -1)
    return {
        "frames": len(diff),
        "max_abs": int(diff.max()) if diff.size else 0,
        "mean_abs": float(diff.mean()) if diff.size else 0.0,
        "worst_frame_mean_abs": float(per_frame.mean(axis=1).max()) if diff.size else 0.0,
        "frames_differing": int((per_frame.max(axis=1) > 0).sum()),
        "pixels_differing": int((diff.max(axis=-1) > 0).sum()),
    }


def main(argv: list[str] | None = None) -> int:
    """Render on both checkouts and print the differences; exit 1 if they exceed rounding."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", required=True, help="commit whose patches are the reference")
    ap.add_argument("--avatar", default="sample", help="prepared avatar in $LIPSTREAM_HOME")
    ap.add_argument("--random", type=int, default=400, help="random articulation rows besides the speech")
    ap.add_argument("--side", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.side:
        side(*(Path(p) for p in args.side))
        return 0
    sys.path.insert(0, str(REPO / "benchmarks"))
    from before_after import before_tree
    from bench_common import open_or_build_avatar

    from benchmarks.scenarios.viseme_speed import held_out_speech

    before = before_tree(args.before)  # a worktree of that commit, made once
    avatar = Path(open_or_build_avatar(args.avatar).path)
    work = Path(tempfile.mkdtemp(prefix="viseme-equal-"))
    held_out_speech(work / "piper.npz")
    np.savez(work / "rows.npz", **random_rows(args.random))
    for name, checkout in (("before", before), ("after", REPO)):
        subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--side", str(work / "piper.npz"), str(avatar),
             str(work / "rows.npz"), str(work / f"{name}.npz")],
            env={**os.environ, "PYTHONPATH": str(checkout)}, check=True,
        )  # fmt: skip
    b, a = np.load(work / "before.npz"), np.load(work / "after.npz")
    report = {name: compare(b[name], a[name]) for name in ("speech", "random")}
    print(json.dumps({"before_commit": args.before, **report}, indent=2))
    ok = all(r["max_abs"] <= MAX_ABS and r["mean_abs"] <= MEAN_ABS for r in report.values())
    print("same picture (within rounding)" if ok else "DIFFERENT beyond rounding")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Avatar preparation speed per stage, before and after, side by side in one run (issue 37).

Writes 1080×1920 clips of a small face low on the left with known sway (the astronaut, 640 px wide, moved by
the sample's head motion), a short one (6 s) and a longer one (30 s), then prepares each with this
checkout's lipstream and with the lipstream of a "before" commit (a temporary git worktree, the same
virtualenv via PYTHONPATH), alternating which goes first. Each prepare runs in a fresh process (the face
tracker's start is part of what is measured). Prints frames/s, the per-stage seconds prepare reports
(the before commit reports none) and the crop box's error against the known motion.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks prepare_stages [--seconds 6 30] [--before f70cc2d]

Records benchmarks/results/prepare_stages.json (benchmarks.results.record). Timings on a shared machine are
noisy: only the two columns of one run compare.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a file: `benchmarks` is a package at the repository root; appended,
    sys.path.append(str(REPO))  # so a "before" run's PYTHONPATH (its own lipstream) stays ahead of it

from benchmarks.results import Figure, cpu_model, record  # noqa: E402

WIDTH, HEIGHT, FPS = 1080, 1920, 25
PICTURE_PX = 640  # the astronaut picture's width: her face is ~170 px wide on the 1080 px canvas
PLACE = (0.06, 0.58)  # the picture's top-left corner, as shares of the canvas (low, on the left)


def write_small_face_clip(path: Path, seconds: float, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """An H.264 clip of a small face low on the left with the sample's head motion; returns (dx, dy)."""
    import cv2
    from skimage import data as skdata

    from lipstream.avatar.sample import encode_clip, head_motion, studio_background

    frames = int(round(seconds * FPS))
    dx, dy = head_motion(frames, FPS, WIDTH, HEIGHT, seed)
    astronaut = skdata.astronaut()
    scale = PICTURE_PX / astronaut.shape[1]
    left, top = PLACE[0] * WIDTH, PLACE[1] * HEIGHT
    background = studio_background(WIDTH, HEIGHT, seed)

    def pictures():
        for i in range(frames):
            warp = np.array([[scale, 0, left + dx[i]], [0, scale, top + dy[i]]], dtype=np.float32)
            yield cv2.warpAffine(astronaut, warp, (WIDTH, HEIGHT), flags=cv2.INTER_LINEAR,
                                 borderMode=cv2.BORDER_TRANSPARENT, dst=background.copy())  # fmt: skip

    encode_clip(path, pictures(), fps=FPS)
    return dx, dy


def box_error(boxes: np.ndarray, dx: np.ndarray, dy: np.ndarray) -> dict:
    """Mean and max distance (px) of the box centre's motion from the known motion, both mean-removed."""
    cx, cy = (boxes[:, 0] + boxes[:, 2]) / 2.0, (boxes[:, 1] + boxes[:, 3]) / 2.0
    ex = (cx - cx.mean()) - (dx - dx.mean())
    ey = (cy - cy.mean()) - (dy - dy.mean())
    err = np.hypot(ex, ey)
    return {"mean_px": round(float(err.mean()), 3), "max_px": round(float(err.max()), 3)}


def prepare_once(clip: Path, motion: Path, root: Path) -> dict:
    """One prepare in this process (the lipstream on PYTHONPATH): wall time, stages, box error."""
    from lipstream.avatar.prepare import prepare_avatar

    started = time.perf_counter()
    bundle = prepare_avatar(clip, "bench", avatars_root=root, force=True, progress=False)
    wall = time.perf_counter() - started
    moves = np.load(motion)
    m = bundle.manifest
    return {
        "frames": bundle.frame_count,
        "wall_s": round(wall, 3),
        "fps": round(bundle.frame_count / wall, 1),
        "prepare_seconds": m.prepare_seconds,
        "stages": getattr(m, "prepare_stages", {}) or {},
        "box_error": box_error(np.asarray(bundle.boxes, np.float64), moves["dx"], moves["dy"]),
        "footage_mb": round(m.video.footage_bytes / 1e6, 2),
        "loop_mb": round(m.video.loop_bytes / 1e6, 2),
    }


def run_in(tree: Path, clip: Path, motion: Path, root: Path) -> dict:
    """prepare_once in a fresh process that imports lipstream from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--one", str(clip), str(motion), str(root)]
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"prepare in {tree} failed:\n{done.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # CPU seconds of the process and its face tracker (and Python's start): steadier than wall time when
    # the machine is shared
    cpu = (after.ru_utime - used.ru_utime) + (after.ru_stime - used.ru_stime)
    result["cpu_s"] = round(cpu, 2)
    result["cpu_ms_per_frame"] = round(1000 * cpu / result["frames"], 1)
    return result


def before_tree(rev: str, where: Path) -> Path:
    """A detached worktree of `rev` at `where` (removed by `drop_tree`)."""
    subprocess.run(["git", "worktree", "add", "--detach", "-f", str(where), rev], cwd=REPO, check=True,
                   capture_output=True)  # fmt: skip
    return where


def drop_tree(where: Path) -> None:
    """Remove the before worktree."""
    subprocess.run(["git", "worktree", "remove", "--force", str(where)], cwd=REPO, capture_output=True)
    shutil.rmtree(where, ignore_errors=True)


def print_table(seconds: float, before: dict, after: dict) -> None:
    """The two runs of one clip side by side."""
    print(f"\n{seconds:g} s clip ({after['frames']} frames, {WIDTH}×{HEIGHT}, small face)   before    after")
    for key, label in (("fps", "frames/s"), ("wall_s", "wall s"), ("cpu_s", "CPU s (all processes)"),
                       ("cpu_ms_per_frame", "CPU ms a frame")):  # fmt: skip
        print(f"  {label:34s} {before[key]:8.2f} {after[key]:8.2f}")
    for key in ("mean_px", "max_px"):
        print(f"  {'box error ' + key:34s} {before['box_error'][key]:8.3f} {after['box_error'][key]:8.3f}")
    print(f"  {'footage MB / loop MB':34s} {before['footage_mb']:4.1f}/{before['loop_mb']:<4.1f}"
          f" {after['footage_mb']:4.1f}/{after['loop_mb']:<4.1f}")  # fmt: skip
    print("  stages (after; the before commit reports none):")
    for stage, value in after["stages"].items():
        print(f"    {stage:32s} {'':8s} {value:8.2f}")


def main(argv: list[str] | None = None) -> int:
    """Prepare each clip with the before and after trees, print and record the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, nargs="+", default=[6.0, 30.0])
    parser.add_argument("--before", default="f70cc2d", help="the commit to compare with")
    parser.add_argument("--rounds", type=int, default=1, help="prepares per tree and clip (the best counts)")
    parser.add_argument("--one", nargs=3, metavar=("CLIP", "MOTION", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(prepare_once(*(Path(p) for p in args.one))))
        return 0
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; before = {args.before}, after = this checkout")
    figures: list[Figure] = []
    extra: dict = {"before": args.before, "clips": {}}
    with tempfile.TemporaryDirectory(prefix="prepare-stages-") as tmp:
        tmp = Path(tmp)
        before = before_tree(args.before, tmp / "before")
        try:
            for seconds in args.seconds:
                clip, motion = tmp / f"clip{seconds:g}.mp4", tmp / f"motion{seconds:g}.npz"
                dx, dy = write_small_face_clip(clip, seconds)
                np.savez(motion, dx=dx, dy=dy)
                runs: dict[str, list[dict]] = {"before": [], "after": []}
                for r in range(args.rounds):
                    order = ("after", "before") if r % 2 == 0 else ("before", "after")
                    for which in order:
                        tree = before if which == "before" else REPO
                        runs[which].append(run_in(tree, clip, motion, tmp / f"avatars-{which}"))
                best = {k: min(v, key=lambda run: run["wall_s"]) for k, v in runs.items()}
                print_table(seconds, best["before"], best["after"])
                extra["clips"][f"{seconds:g}s"] = best
                tag = f"{seconds:g}s"
                figures += [
                    Figure(f"prepare_fps_{tag}_before", best["before"]["fps"], "frames/s"),
                    Figure(f"prepare_fps_{tag}_after", best["after"]["fps"], "frames/s", goal=">= 25"),
                    Figure(f"prepare_cpu_{tag}_before", best["before"]["cpu_s"], "s"),
                    Figure(f"prepare_cpu_{tag}_after", best["after"]["cpu_s"], "s"),
                    Figure(f"box_error_{tag}_before", best["before"]["box_error"]["mean_px"], "px"),
                    Figure(f"box_error_{tag}_after", best["after"]["box_error"]["mean_px"], "px"),
                ]
        finally:
            drop_tree(before)
    command = "OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks prepare_stages " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    record("prepare_stages", figures, command, extra=extra)
    return 0


if __name__ == "__main__":
    sys.exit(main())

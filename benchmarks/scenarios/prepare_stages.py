"""Avatar preparation speed per stage on a small face (issue 37), of the lipstream this process imports.

Writes 1080×1920 clips of a small face low on the left with known sway (the astronaut, 640 px wide, moved by
the sample's head motion), a short one (6 s) and a longer one (30 s), then prepares each with the lipstream
this process imports (its tree, via PYTHONPATH), each prepare in a fresh process (the face tracker's start is
part of what is measured). Prints frames/s, the per-stage seconds prepare reports (an older tree may report
none) and the crop box's error against the known motion.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks prepare_stages [--seconds 6 30]

Records benchmarks/results/prepare_stages.json (benchmarks.results.record; --out PATH writes that document
there instead). Timings on a shared machine are noisy: two trees compare side by side in one run, with this
checkout's script on both:

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks before_after --before REV -- prepare_stages \
        --seconds 6 30
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
    sys.path.append(str(REPO))  # so before_after's PYTHONPATH (its tree's lipstream) stays ahead of it

from benchmarks.results import RESULTS_DIR, Figure, cpu_model, record  # noqa: E402

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


def print_table(seconds: float, run: dict) -> None:
    """One clip's figures."""
    print(f"\n{seconds:g} s clip ({run['frames']} frames, {WIDTH}×{HEIGHT}, small face)")
    for key, label in (("fps", "frames/s"), ("wall_s", "wall s"), ("cpu_s", "CPU s (all processes)"),
                       ("cpu_ms_per_frame", "CPU ms a frame")):  # fmt: skip
        print(f"  {label:34s} {run[key]:8.2f}")
    for key in ("mean_px", "max_px"):
        print(f"  {'box error ' + key:34s} {run['box_error'][key]:8.3f}")
    print(f"  {'footage MB / loop MB':34s} {run['footage_mb']:4.1f}/{run['loop_mb']:<4.1f}")
    print("  stages:" if run["stages"] else "  stages: none reported")
    for stage, value in run["stages"].items():
        print(f"    {stage:32s} {value:8.2f}")


def main(argv: list[str] | None = None) -> int:
    """Prepare each clip with the tree whose lipstream this imports; print and record the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, nargs="+", default=[6.0, 30.0])
    parser.add_argument("--rounds", type=int, default=1, help="prepares per clip (the best counts)")
    parser.add_argument("--out", type=Path, help="write the results document here, not in benchmarks/results")
    parser.add_argument("--one", nargs=3, metavar=("CLIP", "MOTION", "ROOT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(prepare_once(*(Path(p) for p in args.one))))
        return 0
    import lipstream

    tree = Path(lipstream.__file__).resolve().parent.parent
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; lipstream of {tree}")
    figures: list[Figure] = []
    extra: dict = {"lipstream": str(tree), "clips": {}}
    with tempfile.TemporaryDirectory(prefix="prepare-stages-") as tmp:
        tmp = Path(tmp)
        for seconds in args.seconds:
            clip, motion = tmp / f"clip{seconds:g}.mp4", tmp / f"motion{seconds:g}.npz"
            dx, dy = write_small_face_clip(clip, seconds)
            np.savez(motion, dx=dx, dy=dy)
            runs = [run_in(tree, clip, motion, tmp / "avatars") for _ in range(args.rounds)]
            best = min(runs, key=lambda run: run["wall_s"])
            print_table(seconds, best)
            tag = f"{seconds:g}s"
            extra["clips"][tag] = best
            figures += [
                Figure(f"prepare_fps_{tag}", best["fps"], "frames/s", goal=">= 25"),
                Figure(f"prepare_cpu_{tag}", best["cpu_s"], "s"),
                Figure(f"box_error_{tag}", best["box_error"]["mean_px"], "px"),
            ]
        given = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--out" and a != str(args.out)]
        command = "OMP_NUM_THREADS=1 python -m benchmarks prepare_stages " + " ".join(given)
        written = record("prepare_stages", figures, command.strip(), extra=extra,
                         results_dir=tmp if args.out else RESULTS_DIR)  # fmt: skip
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(written, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

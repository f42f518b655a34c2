"""The face tracker in its own environment (issue 24): in process (before) against the worker (after).

The same frames (the sample clip: the astronaut photo with a head bob, decoded to RGB) are tracked twice in
one run: by a FaceTracker with mediapipe in its own process (the face environment's Python running this
checkout's tracker with mediapipe importable there: what every install did before issue 24), and by a
FaceTracker in this environment, whose models are the face environment's worker. Per side: the seconds to
the first frame's landmarks (mediapipe's import and graphs, plus the worker's start), the mean and median
ms per later frame, and whether all landmarks are bit-identical. Writes
benchmarks/results/face_worker_bench.json.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/face_worker_bench.py [--width 540 --height 960 --seconds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import av
import numpy as np
from bench_common import cpu_model

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"

# run by either Python: track the frames, save landmarks (NaN where none) and the timings
TRACK = """
import json, sys, time
import numpy as np
from lipstream.avatar.tracking import FaceTracker

frames = np.load(sys.argv[1], mmap_mode="r")
times = []
started = time.perf_counter()
with FaceTracker() as tracker:
    out = []
    for frame in frames:
        t = time.perf_counter()
        found = tracker.track(np.ascontiguousarray(frame))
        times.append(time.perf_counter() - t)
        out.append(found if found is not None else np.full((478, 2), np.nan, np.float32))
    kind = type(tracker.models).__name__
np.save(sys.argv[2], np.stack(out))
result = {"models": kind, "first_s": time.perf_counter() - started - sum(times[1:]),
          "frame_ms": [1000 * s for s in times[1:]], "detections": tracker.detections}
json.dump(result, open(sys.argv[3], "w"))
"""


def decode(path: Path) -> np.ndarray:
    """Every frame of a video as RGB, [n, h, w, 3] uint8."""
    with av.open(str(path)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def track(python: str, frames: Path, folder: Path, name: str, env: dict[str, str]) -> tuple[dict, np.ndarray]:
    """Run TRACK with `python`; its timings and landmarks."""
    marks, timings = folder / f"{name}.npy", folder / f"{name}.json"
    done = subprocess.run([python, "-c", TRACK, str(frames), str(marks), str(timings)], env=env,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(timings.read_text()), np.load(marks)


def summary(timings: dict) -> dict:
    """The figures printed and kept."""
    per_frame = np.array(timings["frame_ms"])
    return {"models": timings["models"], "first_frame_s": round(timings["first_s"], 3),
            "mean_ms": round(float(per_frame.mean()), 2), "median_ms": round(float(np.median(per_frame)), 2),
            "detections": timings["detections"]}  # fmt: skip


def main() -> None:
    """Track the same frames both ways; print them side by side."""
    from lipstream.avatar.face_env import FACE_ENV_VAR, face_python
    from lipstream.avatar.sample import write_sample_video

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--width", type=int, default=540)
    parser.add_argument("--height", type=int, default=960)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    face = str(face_python())
    with tempfile.TemporaryDirectory(prefix="face-worker-bench-") as tmp:
        folder = Path(tmp)
        clip = folder / "clip.mp4"
        write_sample_video(clip, width=args.width, height=args.height, seconds=args.seconds, fps=25, seed=0)
        frames = folder / "frames.npy"
        np.save(frames, decode(clip))
        base = {k: v for k, v in os.environ.items() if k not in (FACE_ENV_VAR, "PYTHONPATH")}
        # before: mediapipe in the tracker's own process (the face environment's Python, this checkout)
        before, before_marks = track(face, frames, folder, "in_process", {**base, "PYTHONPATH": str(REPO)})
        # after: this environment (no mediapipe) and the worker
        after, after_marks = track(sys.executable, frames, folder, "worker", base)
    identical = bool(np.array_equal(before_marks, after_marks, equal_nan=True))
    rows = {"before (in process)": summary(before), "after (worker)": summary(after)}
    print(f"{len(before_marks)} frames {args.width}x{args.height}; {cpu_model()}")
    print(f"{'':22} {'models':20} {'first frame s':>14} {'mean ms':>9} {'median ms':>10} {'detections':>11}")
    for label, row in rows.items():
        print(f"{label:22} {row['models']:20} {row['first_frame_s']:>14} {row['mean_ms']:>9} "
              f"{row['median_ms']:>10} {row['detections']:>11}")  # fmt: skip
    print(f"landmarks bit-identical: {identical}; faces found {int((~np.isnan(after_marks[:, 0, 0])).sum())}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    result = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "cpu": cpu_model(),
              "frames": len(before_marks), "size": [args.width, args.height], "identical": identical,
              **rows}  # fmt: skip
    (RESULTS / "face_worker_bench.json").write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

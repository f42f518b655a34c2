"""Avatar preparation speed and tracking accuracy on the 1080×1920 sample clip, in one run.

Writes a sample presenter clip with known head motion (SampleMotion), then times, on the same file:
  decode          PyAV decode + 25 fps resampling + RGB conversion only
  decode+memmap   the above, writing every frame into an np.lib.format.open_memmap frames.npy (format 1)
  decode+encode   the same through Mp4FrameWriter (x264 on a thread into footage.mp4: format 2, prepare)
  decode+track    the above without writing, plus FaceTracker on every frame
  prepare         the whole prepare_avatar() (decode, encode, track, gaps, boxes, idle loop, save)
and measures how well the crop box follows the known vertical bob (box centre vs. offset, both with
their mean removed), for the smoothed boxes in the bundle and for the raw per-frame boxes.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks prepare [--seconds 10] [--width 1080 --height 1920]

Writes benchmarks/results/prepare_bench.json and benchmarks/results/prepare_tracking.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

from lipstream.avatar.boxes import raw_boxes
from lipstream.avatar.prepare import prepare_avatar
from lipstream.avatar.sample import SampleMotion, write_sample_video
from lipstream.avatar.tracking import FaceTracker
from lipstream.avatar.video_source import iter_frames, probe_video
from lipstream.media.gop_video import Mp4FrameWriter

RESULTS = Path(__file__).resolve().parents[1] / "results"


def time_decode(clip: Path, write_to: Path | None = None, track: bool = False, store: bool = False) -> dict:
    """Frames per second of one pass over the clip, optionally writing frames.npy and/or tracking.

    The frames go into an np.lib.format.open_memmap, or with store=True through Mp4FrameWriter (the
    encoder thread prepare uses).
    """
    info = probe_video(clip)
    frames = None
    shape = (info.frame_count, info.height, info.width, 3)
    if write_to is not None and store:
        frames = _Appender(Mp4FrameWriter(write_to, info.width, info.height, 25))
    elif write_to is not None:
        frames = np.lib.format.open_memmap(write_to, mode="w+", dtype=np.uint8, shape=shape)
    tracker = FaceTracker() if track else None
    track_s = 0.0
    t0 = time.perf_counter()
    for k, rgb in iter_frames(info):
        if frames is not None:
            frames[k] = rgb
        if tracker is not None:
            t1 = time.perf_counter()
            tracker.track(rgb)
            track_s += time.perf_counter() - t1
    flush_s = 0.0
    if frames is not None:
        t1 = time.perf_counter()
        frames.flush()  # memmap: msync, waits for the disk; the writer: waits for its queue and the encoder
        flush_s = time.perf_counter() - t1
        del frames
        write_to.unlink()
    total = time.perf_counter() - t0
    if tracker is not None:
        tracker.close()
    out = {"frames": info.frame_count, "seconds": round(total, 3), "fps": round(info.frame_count / total, 1)}
    if write_to is not None:
        out["flush_s"] = round(flush_s, 3)
    if track:
        out["track_ms_per_frame"] = round(1000 * track_s / info.frame_count, 2)
    return out


class _Appender:
    """Lets the timing loop write `frames[k] = rgb` into an Mp4FrameWriter."""

    def __init__(self, store: Mp4FrameWriter) -> None:
        self.store = store

    def __setitem__(self, k: int, rgb: np.ndarray) -> None:
        self.store.append(rgb)

    def flush(self) -> None:
        self.store.close()


def vertical_error(boxes: np.ndarray, motion: SampleMotion) -> np.ndarray:
    """Box-centre y minus the known offset, both with their mean removed (px per frame)."""
    cy = (boxes[:, 1] + boxes[:, 3]) / 2.0
    return (cy - cy.mean()) - (motion.dy - motion.dy.mean())


def error_stats(err: np.ndarray) -> dict:
    """Mean and max absolute error, and frame-to-frame jitter of the error."""
    return {
        "mean_px": round(float(np.abs(err).mean()), 3),
        "max_px": round(float(np.abs(err).max()), 3),
        "jitter_px": round(float(np.abs(np.diff(err)).mean()), 3),
    }


def plot(motion: SampleMotion, boxes: np.ndarray, raw: np.ndarray, path: Path) -> None:
    """Known bob vs. box centre (top) and the errors (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = np.arange(len(motion.dy)) / motion.fps
    cy = (boxes[:, 1] + boxes[:, 3]) / 2.0
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    top.plot(t, motion.dy - motion.dy.mean(), label="known head offset dy", lw=2)
    top.plot(t, cy - cy.mean(), label="bundle box centre", lw=1)
    top.set_ylabel("px (mean removed)")
    top.legend()
    bottom.plot(t, vertical_error(raw, motion), label="raw per-frame box", lw=0.8, alpha=0.7)
    bottom.plot(t, vertical_error(boxes, motion), label="smoothed box (bundle)", lw=1.2)
    bottom.set_ylabel("error px")
    bottom.set_xlabel("s")
    bottom.legend()
    fig.suptitle(f"Box tracking on the {motion.width}×{motion.height} sample")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write JSON + PNG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--width", type=int, default=1080)
    parser.add_argument("--height", type=int, default=1920)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="prepare-bench-") as tmp:
        tmp = Path(tmp)
        clip = tmp / "presenter.mp4"
        t0 = time.perf_counter()
        motion = write_sample_video(clip, args.width, args.height, args.seconds, progress=True)
        write_s = time.perf_counter() - t0
        stages = {
            "decode": time_decode(clip),
            "decode+memmap": time_decode(clip, write_to=tmp / "frames.npy"),
            "decode+encode": time_decode(clip, write_to=tmp / "footage.mp4", store=True),
            "decode+track": time_decode(clip, track=True),
        }
        t0 = time.perf_counter()
        bundle = prepare_avatar(clip, "bench", avatars_root=tmp / "avatars", progress=True)
        prep_s = time.perf_counter() - t0
        n = bundle.frame_count
        stages["prepare"] = {"frames": n, "seconds": round(prep_s, 3), "fps": round(n / prep_s, 1)}
        boxes = bundle.boxes.astype(np.float64)
        raw = raw_boxes(np.asarray(bundle.landmarks, dtype=np.float64))
        raw[:, 3] += 10
        accuracy = {
            "bob_peak_to_peak_px": round(float(np.ptp(motion.dy)), 1),
            "smoothed_box": error_stats(vertical_error(boxes, motion)),
            "raw_box": error_stats(vertical_error(raw, motion)),
            "face_width_px": bundle.manifest.face_width_px,
        }
        plot(motion, boxes, raw, args.out / "prepare_tracking.png")
    result = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.python_version()}",
        "clip": {
            "width": args.width, "height": args.height, "seconds": args.seconds, "encode_s": round(write_s, 2)
        },
        "stages": stages,
        "ratio_prepare_vs_decode": round(stages["prepare"]["seconds"] / stages["decode"]["seconds"], 2),
        "ratio_memmap_vs_encode": round(
            stages["decode+memmap"]["seconds"] / stages["decode+encode"]["seconds"], 2
        ),
        "tracking": accuracy,
    }
    (args.out / "prepare_bench.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

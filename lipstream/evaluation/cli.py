"""`lipstream eval lipsync VIDEO`: lip-sync measured from the video alone."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lipstream.errors import MediaError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `lipstream eval lipsync`."""
    ev = subparsers.add_parser("eval", help="measure the quality of a rendered video")
    sub = ev.add_subparsers(dest="eval_command", metavar="WHAT", required=True)
    p = sub.add_parser(
        "lipsync",
        help="mouth aperture vs speech envelope: correlation, best lag, silent frames closed",
        description="Tracks the face on every frame, measures the inner-lip aperture, and compares it "
        "with the per-frame RMS envelope of the video's own audio (or --audio). Works on any MP4.",
    )
    p.add_argument("video", type=Path, help="video file (any format FFmpeg reads)")
    p.add_argument("--audio", type=Path, help="audio to compare against (default: the video's own track)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--plot", type=Path, help="PNG plot path (default: VIDEO.lipsync.png beside the video)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run_lipsync)


def run_lipsync(args: argparse.Namespace) -> int:
    """Measure, print and plot."""
    from lipstream.evaluation.lipsync import measure_lipsync, plot_lipsync

    if not args.video.is_file():
        raise MediaError(f"video not found: {args.video}; check the path")
    plot = args.plot or args.video.with_suffix(".lipsync.png")
    if not plot.parent.exists() or not _writable(plot.parent):
        raise MediaError(f"cannot write the plot to {plot}; pass --plot with a writable path")
    report, env, aperture, silent = measure_lipsync(args.video, args.audio, progress=not args.no_progress)
    plot_lipsync(plot, report, env, aperture, silent)
    if args.json:
        print(json.dumps({**report.as_dict(), "plot": str(plot)}, indent=2))
    else:
        closed = (
            "n/a (no silence)" if report.silent_closed_share is None else f"{report.silent_closed_share:.1%}"
        )
        print(f"frames {report.frames} (face in {report.faces_found})")
        print(
            f"envelope correlation {report.correlation_best:.3f} "
            f"at best lag {report.best_lag_frames:+d} frames "
            f"({report.correlation_lag0:.3f} at lag 0; "
            f"{report.correlation_speech_lag0:.3f} over speech frames only)"
        )
        print(f"silent frames {report.silent_frames}, mouth closed in {closed}")
        print(f"plot: {plot}")
    return 0


def _writable(folder: Path) -> bool:
    import os

    return os.access(folder, os.W_OK)

"""`lipstream render`: speech (file or text) -> MP4 of the avatar saying it."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from lipstream.engines.cli_options import add_engine_arguments, engine_options
from lipstream.errors import MediaError


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `lipstream render`."""
    p = subparsers.add_parser("render", help="render an avatar speaking a file or text to MP4")
    p.add_argument("--avatar", required=True, help="avatar name (or bundle folder)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--audio", help="any audio or video file FFmpeg reads")
    src.add_argument("--text", help="text to speak with the offline TTS")
    p.add_argument("-o", "--output", required=True, help="output MP4 path")
    p.add_argument("--voice", default="piper", choices=["piper", "espeak"], help="TTS voice for --text")
    p.add_argument("--report", help="write a JSON report here")
    p.add_argument("--avatars-dir", help="avatars folder (default $LIPSTREAM_HOME/avatars)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--quality", default="balanced", choices=["fast", "balanced", "best"],
        help="H.264 settings: fast = x264 ultrafast crf 23 (smaller files); balanced (default) = ultrafast "
        "crf 20 (sharper, ~1.5x the file size); best = superfast crf 18 (sharpest and smallest, about twice "
        "the encoder time: the render may fall below 2x real time on two cores)",
    )
    accel = p.add_mutually_exclusive_group()
    accel.add_argument(
        "--accel", dest="accel", action="store_true", default=None,
        help="force acceleration on (silence gating, keyframes, codebook, infill); default: per engine",
    )
    accel.add_argument(
        "--no-accel", dest="accel", action="store_false",
        help="render every frame with the engine (no silence gating, keyframes, codebook or infill)",
    )
    add_engine_arguments(p)
    p.set_defaults(func=run_render)


def _check_writable(path: Path, what: str) -> None:
    parent = path.expanduser().resolve().parent
    if not parent.is_dir():
        raise MediaError(f"cannot write {what} {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise MediaError(f"cannot write {what} {path}: folder {parent} is not writable")


def run_render(args: argparse.Namespace) -> int:
    """Render and print a one-line summary."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    from lipstream.avatar.bundle import load_avatar
    from lipstream.engines.base import DescribesMouth
    from lipstream.engines.registry import create_engine
    from lipstream.render.accel import AccelConfig
    from lipstream.render.offline import check_speech, render_speech_to_mp4
    from lipstream.talk.hearing.speech_input import load_speech

    out = Path(args.output)
    _check_writable(out, "output")
    if args.report:
        _check_writable(Path(args.report), "report")
    bundle = load_avatar(args.avatar, args.avatars_dir)
    speech = load_speech(audio=args.audio, text=args.text, voice=args.voice)
    check_speech(speech)
    engine = create_engine(args.engine, **engine_options(args))
    engine.prepare(bundle)
    with Progress(
        TextColumn("rendering"), BarColumn(), TextColumn("{task.completed}/{task.total} frames"),
        TimeRemainingColumn(), disable=args.no_progress, transient=True,
    ) as progress:
        task = progress.add_task("render", total=speech.frame_count)
        report = render_speech_to_mp4(
            bundle, engine, speech, out, accel=AccelConfig(enabled=args.accel), quality=args.quality,
            on_frame=lambda done, total: progress.update(task, completed=done),
        )
    for note in report.notes:
        print(f"note: {note}")
    if isinstance(engine, DescribesMouth):  # the weight-free engine: filmed (atlas) or drawn mouth, and why
        print(f"note: {engine.mouth_source(bundle)}")
    if args.report:
        Path(args.report).write_text(json.dumps(report.model_dump(), indent=2) + "\n")
    print(
        f"wrote {out}: {report.frames} frames, {report.audio_seconds:.2f} s audio, "
        f"{report.wall_seconds:.2f} s wall ({report.realtime_factor:.2f}x real time, engine {report.engine}, "
        f"{report.neural_frames} engine passes, {report.codebook_hits} codebook hits, "
        f"quality {report.quality}: x264 {report.encoder['preset']} crf {report.encoder['crf']})"
    )
    return 0

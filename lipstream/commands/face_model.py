"""`lipstream models face`: build the face tracker's own environment (mediapipe 0.10.21, protobuf<5)."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(models_commands: argparse._SubParsersAction) -> None:
    """Add `lipstream models face`."""
    face = models_commands.add_parser(
        "face",
        help="build the face tracker's environment (mediapipe 0.10.21 and protobuf<5, apart from this one) "
        "that `avatar prepare`, `eval lipsync` and doctor run; fetched from PyPI once",
    )
    face.add_argument("--dest", type=Path, help="where to build it (default: this environment's share/)")
    face.set_defaults(func=run_install)


def run_install(args: argparse.Namespace) -> int:
    """Build (or confirm) the environment; print where its Python is."""
    from lipstream.avatar.face_env import install_face_env

    print(f"face environment: {install_face_env(args.dest) / 'bin' / 'python'}")
    return 0

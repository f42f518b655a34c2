"""`lipstream models turn`: install the Smart Turn end-of-turn model into this Python environment."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(models_commands: argparse._SubParsersAction) -> None:
    """Add `lipstream models turn`."""
    turn = models_commands.add_parser(
        "turn",
        help="install the Smart Turn v3.2 end-of-turn model (`serve --agent --turn-detector smart-turn`): "
        "taken out of the pipecat-ai wheel, fetched from PyPI once",
    )
    turn.add_argument("--wheel", type=Path, help="a pipecat-ai 1.14.0 wheel already downloaded (offline)")
    turn.add_argument("--dest", type=Path, help="where to put the .onnx (default: this environment's share/)")
    turn.set_defaults(func=run_install)


def run_install(args: argparse.Namespace) -> int:
    """Install (or confirm) the model file; print where it is."""
    from lipstream.talk.hearing.smart_turn import install_model

    print(f"Smart Turn model: {install_model(args.dest, args.wheel)}")
    return 0

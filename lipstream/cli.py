"""The `lipstream` command: one entry point, one subcommand per user task."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

from lipstream import __version__
from lipstream.errors import LipstreamError
from lipstream.native_logs import quiet_native_logs

SIGTERM_EXIT = 128 + signal.SIGTERM  # 143, what shells report for a process ended by SIGTERM


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread; a KeyboardInterrupt so it unwinds exactly like Ctrl-C does."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    # a second SIGTERM while temp folders are being removed must not cut the cleanup short
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """While inside, SIGTERM raises Terminated so `finally`/`except BaseException` cleanup runs."""
    if threading.current_thread() is not threading.main_thread():  # handlers can only be set there
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser; each room registers its own subcommands."""
    from lipstream.avatar import cli as avatar_cli
    from lipstream.commands import avatar_engines, face_model, livekit_worker, render_cli, turn_model
    from lipstream.commands import doctor as doctor_cli
    from lipstream.edge import cli as edge_cli
    from lipstream.engines.musetalk import cli as models_cli
    from lipstream.evaluation import cli as eval_cli
    from lipstream.server import cli as server_cli

    parser = argparse.ArgumentParser(prog="lipstream", description="Real-time lip-sync avatars.")
    parser.add_argument("--version", action="version", version=f"lipstream {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    avatar_commands = avatar_cli.register(sub)
    avatar_engines.register(avatar_commands)  # the command layer: avatar commands that need an engine
    for room in (render_cli, eval_cli, server_cli, edge_cli, doctor_cli, livekit_worker):
        room.register(sub)
    models_commands = models_cli.register(sub)
    turn_model.register(models_commands)  # `models turn`: the end-of-turn model (talk, not engines)
    face_model.register(models_commands)  # `models face`: the face tracker's environment
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; user errors print one line and exit 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 1
    try:
        with _sigterm_unwinds(), quiet_native_logs():  # mediapipe's per-batch absl lines (issue 19)
            return int(args.func(args) or 0)
    except LipstreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Terminated:
        print("terminated", file=sys.stderr)
        return SIGTERM_EXIT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

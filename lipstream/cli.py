"""The `lipstream` command: one entry point, one subcommand per user task."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from lipstream import __version__
from lipstream.errors import LipstreamError


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser; each room registers its own subcommands."""
    from lipstream.avatar import cli as avatar_cli
    from lipstream.engines.musetalk import cli as models_cli
    from lipstream.evaluation import cli as eval_cli
    from lipstream.render import cli as render_cli
    from lipstream.server import cli as server_cli

    parser = argparse.ArgumentParser(prog="lipstream", description="Real-time lip-sync avatars.")
    parser.add_argument("--version", action="version", version=f"lipstream {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for room in (avatar_cli, render_cli, eval_cli, models_cli, server_cli):
        room.register(sub)
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
        return int(args.func(args) or 0)
    except LipstreamError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

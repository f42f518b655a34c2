"""Command-line subcommands of this room (registered by lipstream.cli)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add this room's subcommands (not written yet)."""

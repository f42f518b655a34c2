"""Where lipstream keeps its data: $LIPSTREAM_HOME (default ~/.lipstream), and what a Python environment holds
for it (share/lipstream)."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def lipstream_home(env: dict[str, str] | None = None) -> Path:
    """Return the data home: $LIPSTREAM_HOME or ~/.lipstream."""
    env = os.environ if env is None else env
    return Path(env.get("LIPSTREAM_HOME") or Path.home() / ".lipstream").expanduser()


def avatars_dir(override: str | os.PathLike | None = None) -> Path:
    """Return the folder that holds avatar bundles (one sub-folder per avatar name)."""
    return Path(override).expanduser() if override else lipstream_home() / "avatars"


def models_dir(override: str | os.PathLike | None = None) -> Path:
    """Return the folder that holds downloaded neural weights (MuseTalk layout)."""
    return Path(override).expanduser() if override else lipstream_home() / "models"


def environment_share_dir(prefix: str | os.PathLike | None = None) -> Path:
    """This Python environment's (or `prefix`'s) share/lipstream: what `lipstream models` installs into it."""
    return Path(prefix or sys.prefix) / "share" / "lipstream"

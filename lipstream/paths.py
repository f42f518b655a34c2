"""Where lipstream keeps its data: $LIPSTREAM_HOME (default ~/.lipstream)."""

from __future__ import annotations

import os
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

"""Engine construction by name, so callers never import a specific engine."""

from __future__ import annotations

from typing import Any

from lipstream.engines.base import Engine
from lipstream.errors import LipstreamError

ENGINE_NAMES = ("viseme", "musetalk")


def create_engine(name: str = "viseme", **options: Any) -> Engine:
    """Build the engine called `name` with its options (e.g. device, dtype for musetalk)."""
    if name == "viseme":
        from lipstream.engines.viseme.engine import VisemeEngine

        return VisemeEngine(**options)
    if name == "musetalk":
        from lipstream.engines.musetalk.engine import MuseTalkEngine

        return MuseTalkEngine(**options)
    raise LipstreamError(f"unknown engine '{name}'; choose one of: {', '.join(ENGINE_NAMES)}")

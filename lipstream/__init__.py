"""lipstream: real-time lip-sync avatars (a presenter video speaks any audio, live)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["Session", "load_avatar", "create_engine", "__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from lipstream.avatar.bundle import load_avatar
    from lipstream.engines.registry import create_engine
    from lipstream.session import Session


def __getattr__(name: str) -> Any:
    """Import the public API lazily so `import lipstream` stays cheap."""
    if name == "Session":
        from lipstream.session import Session

        return Session
    if name == "load_avatar":
        from lipstream.avatar.bundle import load_avatar

        return load_avatar
    if name == "create_engine":
        from lipstream.engines.registry import create_engine

        return create_engine
    raise AttributeError(name)

"""Per-stage wall-time accounting for reports (mean ms per frame by stage)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Protocol


class RenderObserver(Protocol):
    """Who wants a session's figures as they happen (the server's metrics). Called from render worker
    threads and the event loop, so every method must be cheap and thread-safe."""

    def stage(self, name: str, seconds: float) -> None:
        """One timed piece of work of stage `name` (engine, encode, compositor, ...) took `seconds`."""

    def first_frame(self, seconds: float) -> None:
        """An utterance's first speech frame was made `seconds` after its first input (TTFF)."""

    def late_frame(self, seconds: float) -> None:
        """A frame was made `seconds` after its due time on the playback clock."""


@dataclass
class StageTimer:
    """Accumulates seconds spent per named stage."""

    seconds: dict[str, float] = field(default_factory=dict)
    listener: Callable[[str, float], None] | None = None  # told of every timed piece of work

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Time the body of a `with` block under `name`."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, time.perf_counter() - start)

    def add(self, name: str, seconds: float) -> None:
        """Add `seconds` to stage `name`."""
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        if self.listener is not None:
            self.listener(name, seconds)

    def mean_ms(self, frames: int) -> dict[str, float]:
        """Mean milliseconds per frame for every stage."""
        n = max(frames, 1)
        return {name: round(1000.0 * s / n, 3) for name, s in self.seconds.items()}

"""Per-stage wall-time accounting for reports (mean ms per frame by stage)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class StageTimer:
    """Accumulates seconds spent per named stage."""

    seconds: dict[str, float] = field(default_factory=dict)

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

    def mean_ms(self, frames: int) -> dict[str, float]:
        """Mean milliseconds per frame for every stage."""
        n = max(frames, 1)
        return {name: round(1000.0 * s / n, 3) for name, s in self.seconds.items()}

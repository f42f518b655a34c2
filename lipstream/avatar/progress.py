"""A rich progress bar for frame loops, or a silent stand-in when progress is off."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class Advance(Protocol):
    """Called once per finished frame."""

    def __call__(self, steps: int = 1) -> None: ...


@contextmanager
def frame_progress(label: str, total: int, enabled: bool = True) -> Iterator[Advance]:
    """Yield a function that advances a progress bar of `total` frames (no output when disabled)."""
    if not enabled:
        yield lambda steps=1: None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn())
    with Progress(*columns, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda steps=1: bar.advance(task, steps)

"""Where a prepare's time goes: wall-clock seconds per stage, measured on prepare's own thread.

The encoders run on threads of their own; what they cost the prepare is the time its thread waits for
them (a full queue, the last frames at the end), which is what `encoding` counts. So the stages add up to
the prepare's total, and `other` holds what no stage claimed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields

STAGE_LABELS = {
    "setup": "setup",  # probing the source, the room check
    "tracker_start": "tracker start",  # the face tracker's process and models, to its first answer
    "decoding": "decoding",  # the source's frames (and their RGB conversion), both passes
    "tracking": "tracking",  # face landmarks, frame by frame
    "encoding": "encoding",  # waiting for x264 (footage.mp4 and loop.mp4 are encoded on threads)
    "breathing": "breathing",  # a photo's breathing clip: its matte and moved pictures
    "idle_choice": "idle choice",  # which stretch the idle loop plays
    "blinks": "blinks",  # planning the idle blinks and drawing their lids
    "arrays": "arrays",  # boxes, gaps, nose rows, the .npy files and the manifest
    "other": "other",
}


@dataclass
class PrepareTimes:
    """Seconds of a prepare per stage (they add up to `total`; the encoders' own threads overlap them)."""

    setup: float = 0.0
    tracker_start: float = 0.0
    decoding: float = 0.0
    tracking: float = 0.0
    encoding: float = 0.0
    breathing: float = 0.0
    idle_choice: float = 0.0
    blinks: float = 0.0
    arrays: float = 0.0
    other: float = 0.0
    total: float = 0.0

    def entry(self) -> dict[str, float]:
        """What manifest.json records as `prepare_stages` (seconds, rounded to the millisecond)."""
        return {name: round(value, 3) for name, value in asdict(self).items()}

    @classmethod
    def from_entry(cls, entry: dict) -> PrepareTimes:
        """Read `prepare_stages` back (unknown names are ignored, missing ones are 0)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: float(v) for k, v in entry.items() if k in names})

    def line(self, at_least: float = 0.05) -> str:
        """'tracking 2.1 s, encoding 1.3 s, ...': stages of at least `at_least` s, longest first."""
        parts = [(value, name) for name, value in asdict(self).items() if name != "total"]
        shown = sorted((p for p in parts if p[0] >= at_least), reverse=True)
        return ", ".join(f"{STAGE_LABELS[name]} {value:.1f} s" for value, name in shown) or "none measurable"


class StageClock:
    """Adds wall-clock time to the stages of a PrepareTimes as prepare runs; `finish` fills other/total."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self.started = clock()
        self.times = PrepareTimes()
        self._open: tuple[str, float] | None = None

    def add(self, stage: str, seconds: float) -> None:
        """Count `seconds` to `stage`."""
        setattr(self.times, stage, getattr(self.times, stage) + seconds)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Count the time inside the block to stage `name`."""
        start = self._clock()
        try:
            yield
        finally:
            self.add(name, self._clock() - start)

    def begin(self, name: str) -> None:
        """Start counting to stage `name` until `end` (for a wait that spans leaving a `with` block)."""
        self._open = (name, self._clock())

    def end(self) -> None:
        """Count the time since `begin` to its stage."""
        if self._open is not None:
            name, start = self._open
            self._open = None
            self.add(name, self._clock() - start)

    def timed(self, name: str, items: Iterable) -> Iterator:
        """Iterate `items`, counting the time spent getting each one (a decoder's) to stage `name`."""
        iterator = iter(items)
        while True:
            start = self._clock()
            try:
                item = next(iterator)
            except StopIteration:
                self.add(name, self._clock() - start)
                return
            self.add(name, self._clock() - start)
            yield item

    def elapsed(self) -> float:
        """Seconds since the clock started."""
        return self._clock() - self.started

    def finish(self) -> PrepareTimes:
        """The times, with `total` the elapsed time and `other` what no stage counted."""
        total = self.elapsed()
        claimed = sum(v for k, v in asdict(self.times).items() if k not in ("other", "total"))
        self.times.other = max(0.0, total - claimed)
        self.times.total = total
        return self.times

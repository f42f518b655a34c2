"""The mouth where speech meets the footage: utterances leave and rejoin the presenter's own mouth gradually.

A live session shows the footage as filmed between utterances and the engine's mouth during them. An engine
that can say how to get from one to the other (`onset(feats, first_row)`, `release(last_row)`, the viseme
engine) gets them eased; any other engine keeps the Engine defaults: everything passes through unchanged."""

from __future__ import annotations

from collections import deque

import numpy as np

from lipstream.engines.base import Engine

KEEP_TICKS = 256  # rows remembered per frame: an interrupt resumes at most a few seconds back


class UtteranceEasing:
    """What mouth each recent frame showed, so an utterance starts and ends without a one-frame jump."""

    def __init__(self, engine: Engine) -> None:
        """`engine`: any Engine; its `onset` and `release` hooks decide the easing (by default: none)."""
        self._engine = engine
        self._rows: dict[int, np.ndarray | None] = {}  # tick -> row drawn there (None: the footage's mouth)
        self._tail: deque[np.ndarray] = deque()  # rows for the next idle frames
        self._at_rest = True  # the last frame made shows the footage's own mouth
        self._eased: int | None = None  # the utterance whose first rows ease in

    def speech(self, utterance: int, feats: np.ndarray, first_row: int, first_tick: int) -> np.ndarray:
        """(event loop) An utterance's rows from its row `first_row` on, drawn from tick `first_tick`."""
        if first_row == 0:
            self._eased = utterance if self._at_rest else None
        self._tail.clear()
        self._at_rest = False
        if self._eased == utterance:
            feats = self._engine.onset(feats, first_row)
        if len(self._rows) > 2 * KEEP_TICKS:
            self._rows = {t: r for t, r in self._rows.items() if t > first_tick - KEEP_TICKS}
        for i, row in enumerate(feats):
            self._rows[first_tick + i] = row
        return feats

    def shown(self, tick: int, drawn: bool) -> None:
        """(worker) Frame `tick` was made, with the engine's patch or without one (accelerated silence)."""
        if not drawn:
            self._rows[tick] = None

    def finished(self, last_tick: int) -> None:
        """(event loop) The utterance ended at frame `last_tick`: the next idle frames ease its mouth back."""
        self._start_tail(self._rows.get(last_tick))

    def interrupted(self, resume_tick: int) -> None:
        """(event loop) Frames from `resume_tick` on are dropped: ease back from the one shown before it."""
        # the dropped rows go too: idle frames will hold those ticks, and a later interrupt there must not
        # find a mouth the viewer never saw
        self._rows = {t: r for t, r in self._rows.items() if t < resume_tick}
        self._start_tail(self._rows.get(resume_tick - 1))

    def idle_row(self) -> np.ndarray | None:
        """(event loop) The row for the next idle frame: a step back to the footage, or None (the footage)."""
        if self._tail:
            return self._tail.popleft()
        self._at_rest = True
        return None

    def _start_tail(self, row: np.ndarray | None) -> None:
        self._tail.clear()
        if row is not None:
            self._tail.extend(self._engine.release(row))
            self._at_rest = False

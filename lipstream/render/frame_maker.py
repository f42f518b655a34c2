"""The live session's render-pool half: what each frame becomes once its tick is reserved.

The producer (render/session.py, on the event loop) decides which frames come and when; this makes them on a
render worker, in tick order: mouth patches through the PatchScheduler (or an idle frame's easing row drawn
by the engine), the lids of a blink decided at a phrase end, and the sink's form of the frame."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

from lipstream.avatar.bundle import AvatarBundle
from lipstream.avatar.phrase_blinks import PhraseEndBlinks
from lipstream.engines.base import Engine
from lipstream.engines.batcher import Withdrawn
from lipstream.render.accel import PatchScheduler
from lipstream.render.sinks import FrameSink
from lipstream.render.utterance_easing import UtteranceEasing

# what a made frame is: the sink's form of it, the lids (0 open .. 1 shut), whether a blink starts there
Made = tuple[Any, float, bool]


class FrameMaker:
    """Makes a session's frames on its render worker (one at a time, in tick order)."""

    def __init__(
        self,
        avatar: AvatarBundle,
        engine: Engine,
        scheduler: PatchScheduler,
        sink: FrameSink,
        easing: UtteranceEasing,
        blinks: PhraseEndBlinks | None,
    ) -> None:
        """The session's own parts: this only calls them from the render worker."""
        self.avatar = avatar
        self.engine = engine
        self.scheduler = scheduler
        self.sink = sink
        self.easing = easing
        self.blinks = blinks
        self._voiced: dict[int, bool] = {}  # tick -> voiced, for speech frames not made yet

    def voiced(self, first_tick: int, speaking: np.ndarray) -> None:
        """(event loop) Which speech frames from `first_tick` on are voiced: phrase ends decide blinks."""
        self._voiced.update((first_tick + i, bool(v)) for i, v in enumerate(speaking))

    def forget_voiced(self) -> None:
        """(event loop) An interrupt dropped the speech frames not made yet."""
        self._voiced.clear()

    def schedule(self, feats, silent, base_ids, payloads, final: bool, generation: int) -> list:
        """Worker thread: patches from the scheduler, then composite and encode each released frame."""
        try:
            released = self.scheduler.push(feats, silent, base_ids, payloads) if payloads else []
            if final:
                released += self.scheduler.finish()
        except Withdrawn:  # interrupted while queued for a batched pass: this work is discarded anyway
            return []
        for payload, patch in released:
            self.easing.shown(payload[0], patch is not None)
        return [(payload, self.make(*payload[:2], patch, generation)) for payload, patch in released]

    def make_idle(self, tick: int, base_id: int, row: np.ndarray | None, generation: int) -> Made:
        """Worker thread: an idle frame, drawn with `row`'s mouth while it eases back to the footage."""
        patch = None
        if row is not None:
            with contextlib.suppress(Withdrawn):  # interrupted while queued: the footage's mouth will do
                patch = self.engine.render(self.avatar, row[None, :], np.array([base_id], dtype=np.int64))[0]
        return self.make(tick, base_id, patch, generation)

    def make(self, tick: int, base_id: int, patch: np.ndarray | None, generation: int) -> Made:
        """Worker thread, frames in tick order: the sink's form of the frame, with the lids of a blink decided
        at a phrase end (and whether it starts here)."""
        lids, starts = 0.0, False
        if self.blinks is not None:
            lids = self.blinks.step(tick, self._voiced.pop(tick, False), tick % len(self.avatar.idle_loop))
            starts = self.blinks.started == tick
        return self.sink.make(tick, base_id, patch, generation, lids), lids, starts

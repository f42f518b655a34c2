"""The end-of-turn rule's settings: which detector judges a pause, its threshold, and the silences that end
a turn (kept apart from the detectors so the turn machine reads them without numpy or asyncio)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

DetectorName = Literal["text", "smart-turn", "silence"]
# what ended a turn: the detector's judgement, its low score after a longer silence, its hard cap, the fixed
# silence rule, the turn's length limit
TurnRule = Literal["detector", "unsure", "max_wait", "silence", "turn_limit"]
# a score at or above this means "finished"; the text score is a probability of the message ending right
# there, under 0.005 on unfinished clauses and over 0.03 on finished questions in the bench's set
DEFAULT_THRESHOLDS = {"text": 0.015, "smart-turn": 0.5}
# the unsure tier's share of the threshold (below): the text score's is measured; Smart Turn's scores of
# unfinished pauses reach 0.3-0.98 (benchmarks/scenarios/turn_detector.py), so a share of its 0.5 would end
# nearly every pause after the tier's silence: off
DEFAULT_UNSURE_SHARES = {"text": 0.1, "smart-turn": 0.0}


class TurnEndConfig(BaseModel):
    """The end-of-turn rule."""

    detector: DetectorName = "text"
    threshold: float | None = Field(None, gt=0, lt=1)  # None: the detector's default
    finished_ms: float = Field(200, ge=0, le=2000)  # silence that ends a turn judged finished
    max_wait_ms: float = Field(1600, ge=200, le=5000)  # silence that ends any turn (the hard cap)
    # A score under the threshold but at least this share of it ends the turn after `unsure_ms`: the longer
    # the silence, the less sure the detector need be. Misheard finished questions score 0.002-0.005 with
    # the text detector (the knowledge desk: "When Does the Book Club Me?", "What is the address on the
    # library?"), as do 6 of 24 unfinished clauses (0.002-0.014, benchmarks/scenarios/turn_detector.py),
    # but people rarely pause that long inside a clause, and a user who goes on within the join time
    # continues the turn (the answer is cut). 0.8 s: as long as the longest of the conversation benchmark's
    # mid-clause pauses (0.5-0.8 s); at 1 s the three misheard desk questions it ended made the desk's p90.
    # 0 turns the tier off; None: the detector's default.
    unsure_share: float | None = Field(None, ge=0, le=1)
    unsure_ms: float = Field(800, ge=0, le=5000)

    @property
    def uses_detector(self) -> bool:
        """A detector judges pauses (not the plain silence rule)."""
        return self.detector != "silence"

    def finished(self, score: float) -> bool:
        """Whether a detector's score says the turn is over."""
        return score >= self._threshold()

    def unsure_end(self, score: float) -> bool:
        """Whether a score under the threshold still ends the turn, after `unsure_ms` of silence."""
        share = self.unsure_share if self.unsure_share is not None else DEFAULT_UNSURE_SHARES[self.detector]
        return (
            0 < share and self.unsure_ms < self.max_wait_ms
            and share * self._threshold() <= score < self._threshold()
        )  # fmt: skip

    def _threshold(self) -> float:
        return self.threshold if self.threshold is not None else DEFAULT_THRESHOLDS[self.detector]

"""The end-of-turn rule's settings: which detector judges a pause, its threshold, and the silences that end
a turn (kept apart from the detectors so the turn machine reads them without numpy or asyncio)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

DetectorName = Literal["text", "smart-turn", "silence"]
# what ended a turn: the detector's judgement, its hard cap, the fixed silence rule, the turn's length limit
TurnRule = Literal["detector", "max_wait", "silence", "turn_limit"]
# a score at or above this means "finished"; the text score is a probability of the message ending right
# there, under 0.005 on unfinished clauses and over 0.03 on finished questions in the bench's set
DEFAULT_THRESHOLDS = {"text": 0.015, "smart-turn": 0.5}


class TurnEndConfig(BaseModel):
    """The end-of-turn rule."""

    detector: DetectorName = "text"
    threshold: float | None = Field(None, gt=0, lt=1)  # None: the detector's default
    finished_ms: float = Field(200, ge=0, le=2000)  # silence that ends a turn judged finished
    max_wait_ms: float = Field(1600, ge=200, le=5000)  # silence that ends any turn (the hard cap)

    @property
    def uses_detector(self) -> bool:
        """A detector judges pauses (not the plain silence rule)."""
        return self.detector != "silence"

    def finished(self, score: float) -> bool:
        """Whether a detector's score says the turn is over."""
        threshold = self.threshold if self.threshold is not None else DEFAULT_THRESHOLDS[self.detector]
        return score >= threshold

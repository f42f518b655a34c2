"""When is the user's turn over: the end-of-turn rule, and the detectors that judge a pause.

At each pause (the first ~100 ms of silence after speech) a detector scores "the user has finished":
- `text`: the pause's transcript judged by the embedded SmolLM2 (how likely the model finds it that the
  message ends there; it runs in the language model's own process, see LlamaChat.end_of_turn).
- `smart-turn`: the Smart Turn v3.2 audio model on the last 8 s of the user's audio.
- `silence`: no detector: the turn ends after a fixed silence, as before.
A turn judged finished ends once its silence reaches `finished_ms`; one judged unfinished waits for more
speech up to `max_wait_ms` of silence, which ends any turn. (The silence rule's length is the conversation's
`end_silence_ms`.)
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from typing import Literal, Protocol

import numpy as np
from pydantic import BaseModel, Field

from lipstream.talk.llm import ChatMessage

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


class TurnDetector(Protocol):
    """Scores how likely the user has finished, at a pause: from the turn's audio and/or its transcript."""

    name: str
    needs_text: bool  # the score waits for the pause's transcript

    async def score(self, audio: np.ndarray, messages: list[ChatMessage]) -> float:
        """0..1: the user has finished. `audio`: the turn so far (16 kHz); `messages`: system prompt, history
        and the user's transcript so far, last."""


class EndOfTurnModel(Protocol):
    """A language model that can judge where a message ends (the embedded SmolLM2)."""

    async def end_of_turn(self, messages: list[ChatMessage]) -> float:
        """How likely the last (user) message is finished, 0..1."""


class TextTurnDetector:
    """The transcript judged by a language model (the embedded SmolLM2 in its own process)."""

    name = "text"
    needs_text = True

    def __init__(self, model: EndOfTurnModel) -> None:
        self.model = model

    async def score(self, audio: np.ndarray, messages: list[ChatMessage]) -> float:
        """The model's probability that the user's message ends where the transcript stops."""
        return await self.model.end_of_turn(messages)


class AudioScorer(Protocol):
    """An audio end-of-turn model (SmartTurnModel)."""

    def __call__(self, audio: np.ndarray) -> float:
        """0..1: finished."""


class SmartTurnDetector:
    """The Smart Turn v3.2 audio model, run on `executor` (≈ 120-150 ms of one core per pause)."""

    name = "smart-turn"
    needs_text = False

    def __init__(self, model: AudioScorer, executor: Executor | None = None) -> None:
        self.model = model
        self.executor = executor

    async def score(self, audio: np.ndarray, messages: list[ChatMessage]) -> float:
        """Smart Turn's probability that the turn is complete."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, self.model, audio)

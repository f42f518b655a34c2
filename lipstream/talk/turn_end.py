"""When is the user's turn over: the end-of-turn rule, and the detectors that judge a pause.

At each pause (the first ~100 ms of silence after speech) a detector scores "the user has finished":
- `text`: the pause's transcript judged by the embedded SmolLM2 (how likely the model finds it that the
  message ends there; it runs in the language model's own process, see LlamaChat.end_of_turn).
- `smart-turn`: the Smart Turn v3.2 audio model on the last 8 s of the user's audio.
- `silence`: no detector: the turn ends after a fixed silence, as before.
A turn judged finished ends once its silence reaches `finished_ms`; one judged unfinished waits for more
speech up to `max_wait_ms` of silence, which ends any turn. (The silence rule's length is the conversation's
`end_silence_ms`.) The rule's settings are in turn_rule.py.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from typing import Protocol, runtime_checkable

import numpy as np

from lipstream.talk.models.llm import ChatMessage


class TurnDetector(Protocol):
    """Scores how likely the user has finished, at a pause: from the turn's audio and/or its transcript."""

    name: str
    needs_text: bool  # the score waits for the pause's transcript

    async def score(self, audio: np.ndarray, messages: list[ChatMessage]) -> float:
        """0..1: the user has finished. `audio`: the turn so far (16 kHz); `messages`: system prompt, history
        and the user's transcript so far, last."""


@runtime_checkable
class EndOfTurnModel(Protocol):
    """A language model that can judge where a message ends (the embedded SmolLM2); asked with isinstance."""

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

    async def prefill(self, messages: list[ChatMessage]) -> None:
        """Read the prompt heard so far into the judge's cache (a judgement whose score is not used), so the
        pause's judgement reads only the last words."""
        await self.model.end_of_turn(messages)


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

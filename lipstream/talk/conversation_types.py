"""A conversation's settings, the events callback and observer it is given, the report of each turn."""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

from pydantic import BaseModel, Field

from lipstream.talk.hearing.transcriber import WHOLE_TURN_SECONDS
from lipstream.talk.hearing.vad import END_SILENCE_MS, PAUSE_MS, START_MS, VoiceActivityDetector
from lipstream.talk.turn_rule import TurnEndConfig, TurnRule

DEFAULT_SYSTEM_PROMPT = (
    "You are a friendly presenter who answers out loud. Always reply in English, in one to three short "
    "spoken sentences, in plain words: no lists, no markdown, no emoji."
)
DEFAULT_WAIT_LINE = "One moment, please. I am with another visitor, and I will answer you as soon as I can."
Emit = Callable[[dict[str, Any]], Awaitable[None]]


class ConversationConfig(BaseModel):
    """How a conversation listens and answers."""

    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    # user and assistant messages kept (the system prompt aside)
    max_history_messages: int = Field(12, ge=0, le=200)
    max_reply_tokens: int = Field(120, ge=8, le=1024)
    max_turn_seconds: float = Field(30.0, gt=1)  # a longer monologue is cut there and answered
    partial_every_seconds: float = Field(0.5, gt=0)  # re-decode the growing turn this often
    # commit stable words while the user speaks and decode only each turn's tail at the end
    # (lipstream.talk.hearing.transcriber); off: every decode reads the whole turn, as before
    streaming_recognition: bool = False
    # with streaming recognition, a turn shorter than this commits nothing and is decoded whole (a question
    # decodes whole faster and truer than as a prompted tail: lipstream.talk.hearing.transcriber)
    commit_after_seconds: float = Field(WHOLE_TURN_SECONDS, ge=0)
    preroll_seconds: float = Field(0.25, ge=0)  # audio before the detected onset given to STT
    start_ms: float = Field(START_MS, gt=0)  # speech shorter than this (a cough, a click) never starts a turn
    end_silence_ms: float = Field(END_SILENCE_MS, ge=100, le=5000)  # silence that ends the user's turn
    # silence after which the answer starts being prepared (speech recognition, the model's first words),
    # kept if the silence lasts to end_silence_ms, dropped if the user goes on
    pause_ms: float = Field(PAUSE_MS, gt=0)
    # the end-of-turn rule: a detector judging each pause, or the plain silence rule (end_silence_ms)
    turn: TurnEndConfig = Field(default_factory=lambda: TurnEndConfig(detector="silence"))
    # user speech starting this soon after the end of their turn, while its answer has not finished playing,
    # continues that turn (a pause judged wrongly): the answer stops and the whole question is answered
    join_seconds: float = Field(2.5, ge=0, le=10)
    # ... unless the user had heard this much of the answer: then they cut in on it (a new turn)
    join_heard_seconds: float = Field(1.5, ge=0, le=10)
    apology: str = "Sorry, I cannot answer that right now."  # said when the language model fails
    # said when a turn ends while every seat of the server is taken (lipstream.talk.seats): the answer waits
    wait_line: str = Field(DEFAULT_WAIT_LINE, min_length=1, max_length=300)
    voice: str | None = None

    @property
    def vad_end_silence_ms(self) -> float:
        """The silence after which the VAD itself ends a turn: a detector's hard cap, or the silence rule."""
        return self.turn.max_wait_ms if self.turn.uses_detector else self.end_silence_ms

    def voice_activity(self, model: Any = None) -> VoiceActivityDetector:
        """A VAD for one microphone with this config's start, pause and end (`model`: shared SileroModel)."""
        start, end, pause = self.start_ms, self.vad_end_silence_ms, self.pause_ms
        return VoiceActivityDetector(start_ms=start, end_silence_ms=end, pause_ms=pause, model=model)


def same_words(a: str, b: str) -> bool:
    """Two transcripts say the same words (case and punctuation aside): an answer to one answers the other."""
    return _words(a) == _words(b) and bool(_words(a))


def _words(text: str) -> list[str]:
    return re.sub(r"[^a-z0-9' ]", " ", text.lower()).split()


# a turn's stages, in order, as the client's waterfall shows them (ms after the end of the user's speech): the
# one list every reader of a turn's figures uses (the page, the server's metrics, the benchmarks)
Stage = Literal["transcript", "decision", "llm_first_token", "first_phrase", "first_audio", "first_frame"]
STAGES: tuple[Stage, ...] = get_args(Stage)
Speculation = Literal["pause", "resumed", "none"]


@dataclass
class TurnReport:
    """One turn's figures and its answer's record: when each stage was reached (time.perf_counter seconds),
    how the turn was decided, what was spoken of the answer, and the utterance that spoke it."""

    turn: int
    speech_end: float = 0.0  # when the last sample of the user's speech reached the server
    marks: dict[Stage, float] = field(default_factory=dict)  # a stage's first time only
    interrupted: bool = False
    reported: bool = False
    rule: TurnRule = "silence"  # what ended the user's turn
    score: float | None = None  # the detector's last score for it (None: not judged)
    joined: bool = False  # the turn was continued after a pause judged wrongly
    first_pts: int | None = None  # the pts (samples) its answer's first speech frame plays at
    dropped_answers: int = 0  # speculative answers prepared for it and dropped (the user went on)
    dropped_tokens: int = 0  # ... and the tokens the model wrote for them
    # where the spoken answer was started: at the pause that ended the turn, at an earlier pause the user
    # spoke past without changing the words ("resumed"), or only once the turn had ended ("none")
    speculation: Speculation = "none"
    spoken: list[str] = field(default_factory=list)  # the answer's sentences, as they were sent to be voiced
    utterance_id: int | None = None  # the session's utterance that speaks the answer
    waited_ms: float | None = None  # how long the answer waited for a seat (None: it did not wait)

    def mark(self, stage: Stage, at: float | None = None) -> bool:
        """Record that `stage` was reached (now, or at `at`); False when it already was."""
        if stage in self.marks:
            return False
        self.marks[stage] = time.perf_counter() if at is None else at
        return True

    def set_utterance(self, utterance_id: int) -> None:
        """The session started the utterance that speaks the answer."""
        self.utterance_id = utterance_id

    def as_ms(self) -> dict[str, float | None]:
        """Each stage's time since the end of the user's speech, in ms (None: not reached)."""
        marks = self.marks
        return {s: round((marks[s] - self.speech_end) * 1000.0, 1) if s in marks else None for s in STAGES}

    def as_event(self) -> dict[str, Any]:
        """The `turn_metrics` event: the stages' times and how the turn was decided and speculated."""
        return {
            "type": "turn_metrics", "turn": self.turn, "interrupted": self.interrupted,
            "end_rule": self.rule, "end_score": None if self.score is None else round(self.score, 4),
            "joined": self.joined, "waited_ms": self.waited_ms,
            "speculation": {
                "used": self.speculation, "dropped_answers": self.dropped_answers,
                "dropped_tokens": self.dropped_tokens,
            },
            "ms": self.as_ms(),
        }  # fmt: skip


class ConversationObserver(Protocol):
    """Told of a conversation's turns as their figures become final (the server's metrics)."""

    def turn_reported(self, report: TurnReport) -> None:
        """A turn's figures are final (its answer played or was cut)."""

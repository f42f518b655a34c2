"""The turn machine: when the user's turn starts, pauses, resumes, ends or goes on, as named states.

Synchronous and pure (no asyncio, no audio): each method takes what happened (the VAD's onset, pause,
resume and end, a judgement of a pause, the silence so far, the turn's length, the answer's end) and
returns the actions the conversation then carries out (start or continue a turn, interrupt the avatar,
prepare an answer, set one aside, drop one, end the turn by a rule). Answers are named by the stream sample
where their pause began, so the machine never holds one. `lipstream.talk.conversation` drives it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.talk.turn_rule import TurnEndConfig, TurnRule


class UserState(str, Enum):
    """What the user is doing, as the machine sees it."""

    SILENT = "silent"  # no open turn
    SPEAKING = "speaking"  # an open turn, speech going on
    PAUSED = "paused"  # an open turn, a pause: its answer is being prepared in case the turn is over


class AgentState(str, Enum):
    """What the avatar is doing in the conversation."""

    LISTENING = "listening"  # nothing to answer
    THINKING = "thinking"  # a turn ended: its answer is being written and voiced
    SPEAKING = "speaking"  # the answer is playing


@dataclass(frozen=True)
class StartTurn:
    """A new turn opens at `start` (stream samples)."""

    turn: int
    start: int


@dataclass(frozen=True)
class ContinueTurn:
    """The last turn goes on (its end was judged wrongly): its recognition restarts at `resumed_at`."""

    turn: int
    start: int
    resumed_at: int
    ended_at: int  # where the turn had been judged over


@dataclass(frozen=True)
class Interrupt:
    """Stop the avatar now; `continued`: the user went on with the question being answered."""

    continued: bool


@dataclass(frozen=True)
class PrepareAnswer:
    """Prepare an answer to the turn up to `end_sample`; `judge`: a detector judges that pause;
    `resume_from`: the answer set aside at that sample, taken over if the words come out the same."""

    end_sample: int
    judge: bool
    resume_from: int | None = None


@dataclass(frozen=True)
class SetAside:
    """The user went on after a pause: the answer prepared there waits (it may still fit)."""

    end_sample: int


@dataclass(frozen=True)
class DropAnswer:
    """An answer prepared for a pause the user talked past is no longer wanted."""

    end_sample: int


@dataclass(frozen=True)
class EndInSilence:
    """The pause was judged finished and its silence is long enough: end the turn there now."""


@dataclass(frozen=True)
class EndTurn:
    """The turn is over by `rule`: answer it with the answer prepared for `end_sample` (`speculated`: it was
    started at the pause that ended it; otherwise a PrepareAnswer for it comes just before)."""

    turn: int
    start: int
    end_sample: int
    rule: TurnRule
    score: float | None  # the detector's judgement of that pause (None: not judged)
    joined: bool
    speculated: bool


TurnAction = (
    StartTurn | ContinueTurn | Interrupt | PrepareAnswer | SetAside | DropAnswer | EndInSilence | EndTurn
)


@dataclass(frozen=True)
class EndedTurn:
    """The last turn that ended: a continuation that starts soon after joins it."""

    turn: int
    start: int
    end: int


@dataclass(frozen=True)
class TurnTiming:
    """The machine's lengths, in stream samples (from the conversation's config)."""

    join: int  # speech this soon after a turn ended, while its answer is live, continues it
    join_heard: int  # ... unless this much of the answer was heard before it: then it is a new turn
    max_turn: int  # a longer turn is cut and answered
    finished_ms: float  # silence that ends a turn judged finished
    judges: bool  # a detector judges pauses (else the fixed silence rule ends turns)
    rule: TurnEndConfig

    @classmethod
    def of(
        cls, turn: TurnEndConfig, join_seconds: float, max_turn_seconds: float,
        join_heard_seconds: float = 1.5,
    ) -> TurnTiming:
        """The timing of a conversation's config."""
        return cls(
            join=int(join_seconds * SAMPLE_RATE), join_heard=int(join_heard_seconds * SAMPLE_RATE),
            max_turn=int(max_turn_seconds * SAMPLE_RATE), finished_ms=turn.finished_ms,
            judges=turn.uses_detector, rule=turn,
        )  # fmt: skip


@dataclass
class TurnMachine:
    """One conversation's turn state. Methods return the actions to carry out, in order."""

    timing: TurnTiming
    turn: int = 0
    agent: AgentState = AgentState.LISTENING
    start: int | None = None  # where the open turn's speech began (None: no open turn)
    joined: bool = False  # the open turn continues one whose end was judged wrongly
    prepared_at: int | None = None  # the pause whose answer is being prepared
    score: float | None = None  # the judgement of that pause (None: not yet)
    set_aside_at: int | None = None  # a pause the user spoke past: its answer waits
    last_ended: EndedTurn | None = None
    ignore_until_end: bool = False  # a monologue was cut: the rest of it is not a new turn

    @property
    def user(self) -> UserState:
        """The user's state, derived from the open turn and its pause (whose answer is being prepared)."""
        if self.start is None:
            return UserState.SILENT
        return UserState.PAUSED if self.prepared_at is not None else UserState.SPEAKING

    @property
    def open(self) -> bool:
        """A turn is open (the user is speaking or paused in it)."""
        return self.start is not None

    @property
    def pause_score(self) -> float | None:
        """The judgement of the current pause (None: no pause, or not judged yet)."""
        return self.score if self.prepared_at is not None else None

    def judged_finished(self) -> bool:
        """The current pause was judged the end of the turn (it ends once silent long enough)."""
        score = self.pause_score
        return score is not None and self.timing.rule.finished(score)

    def joinable(self, sample: int, answering: bool, heard: int = 0) -> bool:
        """Speech starting at `sample` would continue the last turn: it ended less than the join time
        before, and its answer is still to come or playing but had been heard for less than `join_heard`
        (`heard` samples: a pause judged wrongly, not the user cutting in on an answer they listened to)."""
        last = self.last_ended
        return (
            last is not None and sample - last.end <= self.timing.join and answering
            and heard < self.timing.join_heard
        )  # fmt: skip

    # ---- what happened --------------------------------------------------------------------------------

    def speech_started(self, sample: int, answering: bool, heard: int = 0) -> list[TurnAction]:
        """The VAD heard speech begin at `sample`; `answering`: the avatar speaks, or an answer is coming;
        `heard`: samples of that answer played before `sample`."""
        if self.ignore_until_end:
            return []
        joined = self.joinable(sample, answering, heard)
        actions: list[TurnAction] = [Interrupt(continued=joined)] if answering else []
        if joined:
            assert self.last_ended is not None
            self.start = self.last_ended.start
            ended_at = self.last_ended.end
            actions.append(ContinueTurn(self.turn, self.start, resumed_at=sample, ended_at=ended_at))
        else:
            self.turn += 1
            self.start = sample
            actions.append(StartTurn(self.turn, sample))
        self.joined = joined
        self.last_ended = None
        if answering:
            self.agent = AgentState.LISTENING
        return actions

    def paused(self, sample: int) -> list[TurnAction]:
        """A pause began at `sample`: the turn may be over, so its answer starts being prepared."""
        if self.start is None:
            return []
        actions: list[TurnAction] = [DropAnswer(self.prepared_at)] if self.prepared_at is not None else []
        actions.append(PrepareAnswer(sample, judge=self.timing.judges, resume_from=self.set_aside_at))
        self.prepared_at, self.score, self.set_aside_at = sample, None, None
        return actions

    def resumed(self) -> list[TurnAction]:
        """Speech after a pause, before the turn's end: its answer is set aside, an older one dropped."""
        if self.prepared_at is None:
            return []
        actions: list[TurnAction] = [DropAnswer(self.set_aside_at)] if self.set_aside_at is not None else []
        actions.append(SetAside(self.prepared_at))
        self.set_aside_at, self.prepared_at, self.score = self.prepared_at, None, None
        return actions

    def judged(self, end_sample: int, score: float) -> None:
        """A detector judged the pause at `end_sample` (ignored when that pause is past)."""
        if end_sample == self.prepared_at:
            self.score = score

    def judged_unsure(self) -> bool:
        """The current pause scored under the threshold, but high enough to end the turn after a longer
        silence (`TurnEndConfig.unsure_end`)."""
        score = self.pause_score
        return score is not None and self.timing.rule.unsure_end(score)

    def silence(self, silence_ms: float) -> list[TurnAction]:
        """The open turn's silence has lasted `silence_ms`: a pause judged finished ends it, one judged
        unsure once the silence is longer."""
        if self.judged_finished() and silence_ms >= self.timing.finished_ms:
            return [EndInSilence()]
        if self.judged_unsure() and silence_ms >= self.timing.rule.unsure_ms:
            return [EndInSilence()]
        return []

    def heard_until(self, sample: int) -> list[TurnAction]:
        """The microphone reached `sample`: a turn longer than the limit is cut there and answered."""
        if self.start is None or sample - self.start <= self.timing.max_turn:
            return []
        self.ignore_until_end = True
        return self._end(sample, "turn_limit")

    def speech_ended(self, sample: int) -> list[TurnAction]:
        """The VAD ended the speech at `sample` (its silence rule, the detector's cap, or EndInSilence)."""
        rule: TurnRule = "silence"
        if self.timing.judges:
            rule = "detector" if self.judged_finished() else "unsure" if self.judged_unsure() else "max_wait"
        if self.ignore_until_end:
            self.ignore_until_end = False
            return []
        if self.start is None:
            return []
        return self._end(sample, rule)

    def answer_started(self) -> None:
        """The answer's first frame is playing."""
        self.agent = AgentState.SPEAKING

    def answer_done(self) -> None:
        """The answer finished playing, was cut, or there was nothing to answer."""
        self.agent = AgentState.LISTENING

    def keep_from(self, sample: int, answering: bool, preroll: int) -> int | None:
        """The earliest microphone sample still needed at `sample` (None: a turn is open, keep all)."""
        if self.start is not None:
            return None
        keep = sample - 2 * SAMPLE_RATE
        if self.joinable(sample, answering):  # a continuation would need the whole last turn
            assert self.last_ended is not None
            keep = min(keep, self.last_ended.start - preroll)
        return keep

    # ---- ---------------------------------------------------------------------------------------------

    def _end(self, sample: int, rule: TurnRule) -> list[TurnAction]:
        assert self.start is not None
        speculated = self.prepared_at == sample
        actions: list[TurnAction] = []
        if speculated:
            if self.set_aside_at is not None:
                actions.append(DropAnswer(self.set_aside_at))
        else:
            if self.prepared_at is not None:
                actions.append(DropAnswer(self.prepared_at))
            actions.append(PrepareAnswer(sample, judge=False, resume_from=self.set_aside_at))
        score = self.score if speculated else None
        actions.append(EndTurn(self.turn, self.start, sample, rule, score, self.joined, speculated))
        self.last_ended = EndedTurn(self.turn, self.start, sample)
        self.start, self.prepared_at, self.score, self.set_aside_at = None, None, None, None
        self.agent = AgentState.THINKING
        return actions


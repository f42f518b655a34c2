"""The turn machine alone (lipstream.talk.turns): every transition as a table of what happened and the actions
and states that follow. No event loop, no audio, no model."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from lipstream.talk.turn_rule import TurnEndConfig
from lipstream.talk.turns import (
    AgentState,
    ContinueTurn,
    DropAnswer,
    EndInSilence,
    EndTurn,
    Interrupt,
    PrepareAnswer,
    SetAside,
    StartTurn,
    TurnAction,
    TurnMachine,
    TurnTiming,
    UserState,
)

S = 16  # samples in a millisecond
SILENCE = TurnEndConfig(detector="silence")
JUDGED = TurnEndConfig(detector="text", finished_ms=200, max_wait_ms=1600)


def machine(rule: TurnEndConfig = SILENCE) -> TurnMachine:
    """A machine with a 2.5 s join window and a 30 s turn limit."""
    return TurnMachine(TurnTiming.of(rule, join_seconds=2.5, max_turn_seconds=30))


@dataclass(frozen=True)
class Step:
    """One thing that happened, and what must follow."""

    event: str  # start, start_answering, pause, resume, judge, silence, heard, end, answer_started, done
    arg: int | float = 0
    actions: tuple[TurnAction, ...] = ()
    user: UserState | None = None
    agent: AgentState | None = None
    heard: int = 0  # a start's samples of the answer heard before it


def happen(m: TurnMachine, step: Step) -> list[TurnAction]:
    """Feed one step to the machine."""
    if step.event in ("start", "start_answering"):
        return m.speech_started(int(step.arg), answering=step.event == "start_answering", heard=step.heard)
    if step.event == "pause":
        return m.paused(int(step.arg))
    if step.event == "resume":
        return m.resumed()
    if step.event == "judge":
        m.judged(m.prepared_at if m.prepared_at is not None else -1, float(step.arg))
        return []
    if step.event == "silence":
        return m.silence(float(step.arg))
    if step.event == "heard":
        return m.heard_until(int(step.arg))
    if step.event == "end":
        return m.speech_ended(int(step.arg))
    if step.event == "answer_started":
        m.answer_started()
        return []
    assert step.event == "done"
    m.answer_done()
    return []


U, A = UserState, AgentState
SCRIPTS: dict[str, tuple[TurnEndConfig, list[Step]]] = {
    "a question, then its end by silence": (SILENCE, [
        Step("start", 1000, (StartTurn(1, 1000),), U.SPEAKING, A.LISTENING),
        Step("pause", 9000, (PrepareAnswer(9000, judge=False),), U.PAUSED),
        Step("end", 9000, (EndTurn(1, 1000, 9000, "silence", None, False, True),), U.SILENT, A.THINKING),
        Step("answer_started", agent=A.SPEAKING),
        Step("done", agent=A.LISTENING),
    ]),
    "speech after a pause sets its answer aside; the next pause may take it over": (SILENCE, [
        Step("start", 0, (StartTurn(1, 0),)),
        Step("pause", 5000, (PrepareAnswer(5000, judge=False),), U.PAUSED),
        Step("resume", 0, (SetAside(5000),), U.SPEAKING),
        Step("pause", 8000, (PrepareAnswer(8000, judge=False, resume_from=5000),), U.PAUSED),
        Step("end", 8000, (EndTurn(1, 0, 8000, "silence", None, False, True),), U.SILENT),
    ]),
    "a second resume drops the answer set aside before": (SILENCE, [
        Step("start", 0, (StartTurn(1, 0),)),
        Step("pause", 5000, (PrepareAnswer(5000, judge=False),)),
        Step("resume", 0, (SetAside(5000),)),
        Step("pause", 8000, (PrepareAnswer(8000, judge=False, resume_from=5000),)),
        Step("resume", 0, (SetAside(8000),)),
        Step("pause", 9000, (PrepareAnswer(9000, judge=False, resume_from=8000),)),
    ]),
    "an end at a sample with no answer prepared there: prepared then, the stale one dropped": (SILENCE, [
        Step("start", 0, (StartTurn(1, 0),)),
        Step("pause", 5000, (PrepareAnswer(5000, judge=False),)),
        Step("end", 5100, (DropAnswer(5000), PrepareAnswer(5100, judge=False),
                           EndTurn(1, 0, 5100, "silence", None, False, False))),
    ]),
    "an end that comes while an answer is set aside: that answer is offered to the new one": (SILENCE, [
        Step("start", 0, (StartTurn(1, 0),)),
        Step("pause", 5000, (PrepareAnswer(5000, judge=False),)),
        Step("resume", 0, (SetAside(5000),)),
        Step("end", 9000, (PrepareAnswer(9000, judge=False, resume_from=5000),
                           EndTurn(1, 0, 9000, "silence", None, False, False))),
    ]),
    "a pause judged finished ends the turn once its silence is long enough": (JUDGED, [
        Step("start", 0, (StartTurn(1, 0),)),
        Step("pause", 5000, (PrepareAnswer(5000, judge=True),)),
        Step("silence", 300),  # not judged yet: nothing
        Step("judge", 0.5),
        Step("silence", 150),  # judged, silence too short
        Step("silence", 200, (EndInSilence(),)),
        Step("end", 5000, (EndTurn(1, 0, 5000, "detector", 0.5, False, True),), U.SILENT, A.THINKING),
    ]),
    "a pause judged unfinished waits for the hard cap": (JUDGED, [
        Step("start", 0, (StartTurn(1, 0),)),
        Step("pause", 5000, (PrepareAnswer(5000, judge=True),)),
        Step("judge", 0.001),
        Step("silence", 1000),
        Step("end", 5000, (EndTurn(1, 0, 5000, "max_wait", 0.001, False, True),)),
    ]),
    "a pause scored under the threshold but not far under ends after the longer silence": (JUDGED, [
        Step("start", 0, (StartTurn(1, 0),)),
        Step("pause", 5000, (PrepareAnswer(5000, judge=True),)),
        Step("judge", 0.004),  # a tenth of the text threshold (0.015) is 0.0015
        Step("silence", 300),
        Step("silence", 799),
        Step("silence", 800, (EndInSilence(),)),
        Step("end", 5000, (EndTurn(1, 0, 5000, "unsure", 0.004, False, True),), U.SILENT, A.THINKING),
    ]),
    "a judgement of a pause already spoken past is ignored": (JUDGED, [
        Step("start", 0, (StartTurn(1, 0),)),
        Step("pause", 5000, (PrepareAnswer(5000, judge=True),)),
        Step("resume", 0, (SetAside(5000),)),
        Step("judge", 0.9),  # prepared_at is None: judged(-1) matches nothing
        Step("silence", 500),
    ]),
    "speech over the answer interrupts it and opens a new turn": (SILENCE, [
        Step("start", 0, (StartTurn(1, 0),)),
        Step("pause", 5000, (PrepareAnswer(5000, judge=False),)),
        Step("end", 5000, (EndTurn(1, 0, 5000, "silence", None, False, True),)),
        Step("answer_started", agent=A.SPEAKING),
        Step("start_answering", 5000 + 3000 * S,
             (Interrupt(continued=False), StartTurn(2, 5000 + 3000 * S)), U.SPEAKING, A.LISTENING),
    ]),
    "speech soon after the end, while the answer is live, continues the turn": (SILENCE, [
        Step("start", 0, (StartTurn(1, 0),)),
        Step("pause", 5000, (PrepareAnswer(5000, judge=False),)),
        Step("end", 5000, (EndTurn(1, 0, 5000, "silence", None, False, True),)),
        Step("start_answering", 5000 + 1000 * S,
             (Interrupt(continued=True), ContinueTurn(1, 0, resumed_at=5000 + 1000 * S, ended_at=5000))),
        Step("pause", 40000, (PrepareAnswer(40000, judge=False),)),
        Step("end", 40000, (EndTurn(1, 0, 40000, "silence", None, True, True),)),
    ]),
    "speech soon after the end over an answer heard for under 1.5 s still continues the turn": (SILENCE, [
        Step("start", 0, (StartTurn(1, 0),)),
        Step("end", 5000, (PrepareAnswer(5000, judge=False),
                           EndTurn(1, 0, 5000, "silence", None, False, False))),
        Step("answer_started", agent=A.SPEAKING),
        Step("start_answering", 5000 + 2000 * S,
             (Interrupt(continued=True), ContinueTurn(1, 0, resumed_at=5000 + 2000 * S, ended_at=5000)),
             heard=1499 * S),
    ]),
    "speech soon after the end over an answer heard for 1.5 s is the user cutting in": (SILENCE, [
        Step("start", 0, (StartTurn(1, 0),)),
        Step("end", 5000, (PrepareAnswer(5000, judge=False),
                           EndTurn(1, 0, 5000, "silence", None, False, False))),
        Step("answer_started", agent=A.SPEAKING),
        Step("start_answering", 5000 + 2000 * S,
             (Interrupt(continued=False), StartTurn(2, 5000 + 2000 * S)), U.SPEAKING, A.LISTENING,
             heard=1500 * S),
    ]),
    "speech soon after the end, with nothing to answer, is a new turn": (SILENCE, [
        Step("start", 0, (StartTurn(1, 0),)),
        Step("end", 5000, (PrepareAnswer(5000, judge=False),
                           EndTurn(1, 0, 5000, "silence", None, False, False))),
        Step("done"),
        Step("start", 6000, (StartTurn(2, 6000),)),
    ]),
    "a monologue over the limit is cut and answered; its rest is not a new turn": (SILENCE, [
        Step("start", 0, (StartTurn(1, 0),)),
        Step("heard", 30 * 16000),  # at the limit: not over it
        Step("heard", 30 * 16000 + 1, (PrepareAnswer(480001, judge=False),
                                       EndTurn(1, 0, 480001, "turn_limit", None, False, False))),
        Step("start", 490000),  # the same monologue's VAD events: ignored until its end
        Step("end", 500000),
        Step("start", 510000, (StartTurn(2, 510000),)),
    ]),
    "events with no open turn do nothing": (SILENCE, [
        Step("pause", 100), Step("resume"), Step("end", 200), Step("silence", 900), Step("heard", 10**9),
    ]),
}


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_turn_machine_transitions(name: str) -> None:
    rule, steps = SCRIPTS[name]
    m = machine(rule)
    for i, step in enumerate(steps):
        actions = happen(m, step)
        assert tuple(actions) == step.actions, (name, i, step.event, actions)
        if step.user is not None:
            assert m.user is step.user, (name, i, m.user)
        if step.agent is not None:
            assert m.agent is step.agent, (name, i, m.agent)


def test_the_microphone_keeps_a_joinable_turn_whole_and_two_seconds_otherwise() -> None:
    m = machine()
    m.speech_started(16000, answering=False)
    assert m.keep_from(40000, answering=False, preroll=4000) is None  # a turn is open: keep everything
    m.speech_ended(48000)
    assert m.keep_from(64000, answering=True, preroll=4000) == 16000 - 4000  # it may still be continued
    assert m.keep_from(64000, answering=False, preroll=4000) == 64000 - 32000
    assert m.keep_from(48000 + 3 * 16000, answering=True, preroll=4000) == 96000 - 32000  # too late to join


def test_the_unsure_tier_lies_under_the_threshold_and_can_be_turned_off() -> None:
    rule = TurnEndConfig(detector="text")  # threshold 0.015, a tenth of it from 0.8 s of silence
    assert [rule.unsure_end(s) for s in (0.001, 0.0015, 0.01, 0.015)] == [False, True, True, False]
    assert not TurnEndConfig(detector="text", unsure_share=0).unsure_end(0.01)
    assert not TurnEndConfig(detector="text", unsure_ms=1600, max_wait_ms=1600).unsure_end(0.01)
    # Smart Turn scores unfinished pauses up to 0.98: its tier is off unless asked for
    assert not TurnEndConfig(detector="smart-turn").unsure_end(0.3)
    assert TurnEndConfig(detector="smart-turn", unsure_share=0.5).unsure_end(0.3)

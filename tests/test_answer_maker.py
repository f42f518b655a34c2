"""The answer maker alone (lipstream.talk.answers): preparing an answer at a pause (transcript, judgement,
the model's stream), taking over or dropping one set aside, reading ahead, and speaking it into a turn's
report. Fakes for the recogniser's result, the model, the voice and the session (tests/talk_fakes.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np
from talk_fakes import FixedJudge, RecordingSession, ScriptedLLM, ToneVoice

from lipstream.talk.answers import AnswerMaker, PreparedAnswer
from lipstream.talk.conversation_types import ConversationConfig, TurnReport
from lipstream.talk.hearing.mic_buffer import MicBuffer
from lipstream.talk.turn_rule import TurnEndConfig
from lipstream.talk.voices.speaker import Speaker

JUDGED = ConversationConfig(turn=TurnEndConfig(detector="text", finished_ms=200, max_wait_ms=1600))


@dataclass
class Heard:
    """A turn's recognition that has heard `text` (LiveTranscription's `final`)."""

    text: str
    finals: list[int] = field(default_factory=list)

    async def final(self, mic: MicBuffer, end_sample: int) -> str:
        """The transcript up to `end_sample`."""
        self.finals.append(end_sample)
        return self.text


@dataclass
class Maker:
    """An answer maker over fakes, and what it sent and was told."""

    answers: AnswerMaker
    llm: ScriptedLLM
    session: RecordingSession
    mic: MicBuffer
    events: list[dict] = field(default_factory=list)
    judged: list[tuple[int, float]] = field(default_factory=list)


def maker(config: ConversationConfig | None = None, judge: FixedJudge | None = None, llm=None) -> Maker:  # noqa: ANN001
    """An AnswerMaker over fakes (call inside a running loop)."""
    config = config or ConversationConfig()
    llm, session, mic = llm or ScriptedLLM(), RecordingSession(), MicBuffer()
    mic.append(np.zeros(16000 * 3, np.float32), 0.0)
    made = Maker(None, llm, session, mic)  # type: ignore[arg-type]

    async def emit(message: dict) -> None:
        made.events.append(message)

    speaker = Speaker(voices=lambda _name: ToneVoice())
    made.answers = AnswerMaker(
        llm, speaker, session, config, emit, detector=judge, on_judged=lambda e, s: made.judged.append((e, s))
    )
    return made


async def drain(prepared: PreparedAnswer) -> str:
    """The model's whole reply from a prepared answer's queue."""
    await prepared.task
    assert prepared.feeder is not None
    await prepared.feeder
    text = []
    while not prepared.deltas.empty():
        item = prepared.deltas.get_nowait()
        if isinstance(item, str):
            text.append(item)
    return "".join(text)


def test_an_answer_is_prepared_from_the_final_transcript_and_the_history() -> None:
    async def main() -> tuple[Maker, PreparedAnswer, str]:
        m = maker()
        heard = Heard("what time does the library open")
        prepared = m.answers.prepare(1, 32000, heard, m.mic, [])
        reply = await drain(prepared)
        assert heard.finals == [32000]
        return m, prepared, reply

    m, prepared, reply = asyncio.run(main())
    assert prepared.text == "what time does the library open" and prepared.transcript_at is not None
    assert reply == m.llm.answer and prepared.tokens == len(m.llm.answer.split())
    (call,) = m.llm.calls
    assert call[0].role == "system" and call[-1].content.lower().startswith("what time does the library open")


def test_an_answer_set_aside_is_taken_over_when_the_words_are_the_same_and_dropped_when_not() -> None:
    async def main() -> tuple[Maker, PreparedAnswer, PreparedAnswer]:
        m = maker()
        first = m.answers.prepare(1, 16000, Heard("how far is the moon"), m.mic, [])
        await drain(first)
        same = m.answers.prepare(1, 24000, Heard("How far is the moon?"), m.mic, [], resumed=first)
        await same.task
        other = m.answers.prepare(1, 30000, Heard("how far is the moon from earth"), m.mic, [], resumed=same)
        await drain(other)
        return m, same, other

    m, same, other = asyncio.run(main())
    assert same.took_over and same.tokens == len(m.llm.answer.split())  # no second call for the same words
    assert not other.took_over and len(m.llm.calls) == 2
    assert m.answers.dropped == (1, same.tokens)  # the one not taken over was dropped and counted


def test_the_judge_reads_the_plain_prompt_beside_the_answer_and_its_judgement_is_told() -> None:
    judge = FixedJudge(0.5)

    async def main() -> Maker:
        m = maker(JUDGED, judge=judge)
        prepared = m.answers.prepare(3, 20000, Heard("tell me a short joke?"), m.mic, [], judge=True)
        await prepared.task
        assert prepared.score == 0.5 and prepared.judged_at is not None
        assert len(m.llm.calls) == 1  # the answer was asked for before the judgement, not after
        await drain(prepared)
        return m

    m = asyncio.run(main())
    assert m.judged == [(20000, 0.5)]
    decision = {"type": "turn_decision", "turn": 3, "finished": True, "score": 0.5, "detector": "text"}
    assert m.events == [decision]
    assert [(x.role, x.content) for x in judge.messages[-1]] == [
        ("system", JUDGED.system_prompt), ("user", "tell me a short joke")  # as spoken: no final "?"
    ]


def test_a_text_judge_reads_ahead_the_plain_prompt_beside_the_answers_model() -> None:
    judge = FixedJudge(0.5)

    async def main() -> Maker:
        m = maker(JUDGED, judge=judge)
        m.answers.partial_heard([], "what time does", may_read=True)
        await asyncio.sleep(0.01)
        return m

    m = asyncio.run(main())
    assert [r[-1].content for r in judge.read] == ["what time does"]
    assert [p[-1].content for p in m.llm.prefilled] == ["what time does"]


def test_a_partial_is_looked_up_and_read_ahead_only_when_allowed_and_once_per_text() -> None:
    async def main() -> Maker:
        m = maker()
        m.answers.partial_heard([], "what time", may_read=False)
        m.answers.partial_heard([], "what time does", may_read=True)
        await asyncio.sleep(0.01)
        m.answers.partial_heard([], "what time does", may_read=True)
        await asyncio.sleep(0.01)
        return m

    m = asyncio.run(main())
    assert [p[-1].content for p in m.llm.prefilled] == ["what time does"]


def test_speaking_fills_the_turns_report_in_stage_order() -> None:
    async def main() -> tuple[Maker, TurnReport]:
        m = maker()
        prepared = m.answers.prepare(1, 32000, Heard("what time does the library open"), m.mic, [])
        await prepared.task
        report = TurnReport(turn=1)
        await m.answers.speak(prepared, report)
        return m, report

    m, report = asyncio.run(main())
    assert report.utterance_id == 1 and m.session.said == [report.spoken]
    assert " ".join(report.spoken) == m.llm.answer and len(report.spoken) >= 2  # a short first phrase
    marks = report.marks
    assert marks["llm_first_token"] <= marks["first_phrase"] <= marks["first_audio"]


def test_a_failing_model_is_apologised_for_once_and_the_apology_is_not_kept_as_said() -> None:
    async def main() -> tuple[Maker, TurnReport]:
        m = maker(llm=ScriptedLLM(fail=True))
        prepared = m.answers.prepare(1, 32000, Heard("tell me a short joke"), m.mic, [])
        await prepared.task
        report = TurnReport(turn=1)
        await m.answers.speak(prepared, report)
        return m, report

    m, report = asyncio.run(main())
    assert m.session.said == [[ConversationConfig().apology]] and report.spoken == []
    assert [e["code"] for e in m.events if e["type"] == "error"] == ["llm"]

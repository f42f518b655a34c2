"""What the conversation gives the model and the client: the knowledge source's notes in the prompt, the
judge reading the answer's own prompt and the question ahead, and the states the client is sent. Over the
fake parts (tests/talk_fakes.py, tests/conversation_run.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from conversation_run import Run, finish, make, question, say
from talk_fakes import FixedJudge, ScriptedLLM, silence, spoken

from lipstream.talk.conversation_types import ConversationConfig
from lipstream.talk.knowledge.grounding_port import GroundedPrompt
from lipstream.talk.turn_rule import TurnEndConfig


class FakeGrounding:
    """Records what retrieval saw; adds a passage and a source."""

    def __init__(self) -> None:
        self.prefetched: list[str] = []

    def prefetch(self, partial_text: str) -> None:
        self.prefetched.append(partial_text)

    def ground(self, system_prompt: str, user_text: str) -> GroundedPrompt:
        found = ["opens at nine"] if "library" in user_text else []
        notes = f"<notes>{found[0] if found else 'nothing'}</notes>"
        return GroundedPrompt(
            f"{system_prompt}\nRULE\n{notes}", found, ["hours.md"] if found else [],
            instructions=f"{system_prompt}\nRULE", notes=notes,
        )

    async def guard(self, grounded, sentences):  # noqa: ANN001, ANN201
        async for sentence in sentences:
            yield sentence

    def fallback(self, grounded: GroundedPrompt) -> str | None:
        return None  # the model's words always pass


def test_a_knowledge_source_is_searched_on_partials_and_its_passages_reach_the_prompt() -> None:
    grounding = FakeGrounding()

    async def main() -> Run:
        run = make(grounding=grounding)
        await say(run, question("what time does the library open today"))
        await finish(run)
        return run

    run = asyncio.run(main())
    assert grounding.prefetched  # retrieval started while the user spoke
    system, asked = run.llm.calls[-1][0], run.llm.calls[-1][-1]
    assert system.content.endswith("RULE")  # the same instructions every turn: the model's cache keeps them
    assert asked.content == "<notes>opens at nine</notes>\n\nwhat time does the library open today"
    assert all(e["sources"] == ["hours.md"] for e in run.kinds("reply_text"))  # every caption says its notes
    assert run.kinds("reply_text")
    # the model read the notes ahead while the user spoke: the answer's prompt up to the question
    assert run.llm.prefilled and run.llm.prefilled[-1][-1].content == "<notes>opens at nine</notes>"
    assert [m.content for m in run.llm.prefilled[-1][:-1]] == [system.content]


def test_the_turn_detector_reads_the_plain_prompt_and_the_answer_the_notes() -> None:
    """The judge reads the question without the notes (in its own context: a knowledge turn's notes never
    delay the turn's decision); the answer reads the notes before the question."""
    turn = TurnEndConfig(detector="text", finished_ms=200, max_wait_ms=1600)
    judge = FixedJudge(0.5)

    async def main() -> Run:
        run = make(ConversationConfig(start_ms=100, turn=turn), detector=judge, grounding=FakeGrounding())
        await say(run, question("what time does the library open"))
        await finish(run)
        return run

    run = asyncio.run(main())
    judged, answered = judge.messages[-1], run.llm.calls[-1]
    assert [(m.role, m.content) for m in judged] == [
        ("system", ConversationConfig().system_prompt), ("user", "what time does the library open")
    ]
    assert answered[-1].content.startswith("<notes>opens at nine</notes>")
    assert all("<notes>" not in m.content for read in judge.read for m in read)  # its read-aheads too


class _EndpointLLM:
    """Answers as an endpoint does that cannot read ahead (a remote server's)."""

    name = "endpoint"

    def __init__(self) -> None:
        self.inner = ScriptedLLM()

    def stream(self, messages: list, max_tokens: int = 120):  # noqa: ANN201 - the inner async generator
        """The scripted answer."""
        return self.inner.stream(messages, max_tokens)


@pytest.mark.parametrize("answers_from", ["an endpoint", "a model that reads ahead"])
def test_the_judge_and_the_answers_model_read_the_question_ahead_once_each(answers_from: str) -> None:
    turn = TurnEndConfig(detector="text", finished_ms=200, max_wait_ms=1600)
    config = ConversationConfig(start_ms=100, partial_every_seconds=0.3, turn=turn)
    words = "what time does the library open today please tell me"
    llm = _EndpointLLM() if answers_from == "an endpoint" else ScriptedLLM()
    judge = FixedJudge(0.5)

    async def main() -> Run:
        run = make(config, detector=judge, llm=llm)
        await say(run, np.concatenate([silence(0.3), spoken(words), silence(0.7)]))
        await finish(run)
        return run

    run = asyncio.run(main())
    read = [messages[-1].content for messages in judge.read]
    assert read and all(words.startswith(text.lower()) for text in read) and len(set(read)) == len(read)
    assert judge.seen[-1].lower().startswith(read[-1].lower())
    answer_read = [] if answers_from == "an endpoint" else [m[-1].content for m in llm.prefilled]
    assert (answer_read == []) == (answers_from == "an endpoint")
    assert len(set(answer_read)) == len(answer_read)
    assert len(run.session.said) == 1


def test_an_answer_starts_beside_the_judgement() -> None:
    """The judge has a context of its own (the embedded model's second one, or a model of its own): the
    answer does not wait for its judgement."""
    turn = TurnEndConfig(detector="text", finished_ms=200, max_wait_ms=1600)
    config = ConversationConfig(start_ms=100, partial_every_seconds=0.3, turn=turn)
    llm = ScriptedLLM()
    answers_when_judged: list[int] = []

    class SlowJudge(FixedJudge):
        async def score(self, audio: np.ndarray, messages: list) -> float:
            await asyncio.sleep(0.15)  # a judgement takes a while: does the answer wait for it?
            answers_when_judged.append(len(llm.calls))
            return await super().score(audio, messages)

    async def main() -> Run:
        run = make(config, detector=SlowJudge(0.5), llm=llm)
        await say(run, np.concatenate([silence(0.3), spoken("tell me a short joke"), silence(0.8)]))
        await asyncio.sleep(0.3)  # the microphone runs faster than real time here: let the judgement come
        await say(run, silence(0.3))
        await finish(run)
        return run

    run = asyncio.run(main())
    assert answers_when_judged and answers_when_judged[0] == 1
    assert len(run.session.said) == 1 and run.kinds("turn_decision")[0]["finished"] is True


def test_the_client_is_sent_the_agents_and_the_users_states_as_they_change() -> None:
    """Listening while the user speaks and pauses, thinking once the turn ends, speaking from the answer's
    first frame, listening again when it has played; each change sent once."""

    async def main() -> Run:
        run = make()
        await say(run, question("what time does the library open"))
        await finish(run)
        return run

    run = asyncio.run(main())
    states = [(e["agent"], e["user"]) for e in run.kinds("state")]
    assert states == [
        ("listening", "speaking"), ("listening", "paused"), ("thinking", "silent"), ("speaking", "silent"),
        ("listening", "silent"),
    ], states
    assert run.conversation.states[0].value == "listening"

"""A knowledge base and a persona passed in by a program: Pipecat's LLM context and a LiveKit agent's turn are
grounded (real Pipecat and LiveKit Agents objects)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lipstream.talk.knowledge.grounding import NOTES_OPEN
from lipstream.talk.knowledge.index import KnowledgeBase
from lipstream.talk.knowledge.persona import Persona

pytestmark = pytest.mark.slow  # imports Pipecat and LiveKit Agents (seconds)


@pytest.fixture
def knowledge(tmp_path: Path) -> KnowledgeBase:
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "hours.md").write_text("# Hours\nThe library opens at 9 am on weekdays.\n")
    (notes / "wifi.md").write_text("# Wifi\nThe wifi password is bluefern42.\n")
    (notes / "desk.md").write_text("# Desk\nThe front desk lends umbrellas.\n")
    return KnowledgeBase(notes, home=tmp_path / "home")


def test_pipecat_context_gets_the_grounded_system_message(knowledge: KnowledgeBase) -> None:
    pytest.importorskip("pipecat")
    from pipecat.processors.aggregators.llm_context import LLMContext

    from lipstream.integrations.pipecat_knowledge import LipstreamKnowledge

    processor = LipstreamKnowledge(knowledge, Persona(name="Ada", instructions="You help visitors."))
    context = LLMContext(
        [{"role": "system", "content": "old"}, {"role": "user", "content": "What is the wifi password?"}]
    )
    processor._ground(context)
    messages = context.get_messages()
    assert [m["role"] for m in messages] == ["system", "user"]
    system = messages[0]["content"]
    assert (
        system.startswith("Your name is Ada. You help visitors.")
        and "bluefern42" in system.split(NOTES_OPEN)[1]
    )
    assert processor.last_sources == ["wifi.md"]


def test_livekit_turn_gets_the_notes(knowledge: KnowledgeBase) -> None:
    pytest.importorskip("livekit.agents")
    from livekit.agents.llm import ChatContext, ChatMessage

    from lipstream.integrations.livekit.knowledge import LiveKitKnowledge

    helper = LiveKitKnowledge(knowledge, Persona(name="Ada", instructions="You help visitors."))
    assert helper.instructions.startswith("Your name is Ada.")
    turn = ChatContext.empty()
    helper.ground_turn(turn, ChatMessage(role="user", content=["When does the library open?"]))
    added = [m for m in turn.items if getattr(m, "role", None) == "system"]
    assert len(added) == 1 and "9 am" in added[0].text_content and helper.last_sources == ["hours.md"]

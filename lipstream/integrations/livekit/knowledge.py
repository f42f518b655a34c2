"""LiveKit Agents: answers from the user's documents and a persona, in the agent's own LLM.

The agent (the user's `livekit.agents.Agent`) takes the persona's instructions, and grounds each user turn
in its `on_user_turn_completed` hook (LiveKit's place for retrieval):

    knowledge = LiveKitKnowledge(KnowledgeBase("notes/"), Persona.load("ada.toml"))

    class Assistant(Agent):
        def __init__(self) -> None:
            super().__init__(instructions=knowledge.instructions)

        async def on_user_turn_completed(self, turn_ctx, new_message) -> None:
            knowledge.ground_turn(turn_ctx, new_message)

The avatar's face comes from lipstream's AvatarSession as before (lipstream.integrations.livekit).
"""

from __future__ import annotations

from typing import Any

from lipstream.talk.conversation_types import DEFAULT_SYSTEM_PROMPT
from lipstream.talk.knowledge.grounding import GroundingConfig, KnowledgeGrounding
from lipstream.talk.knowledge.index import KnowledgeBase
from lipstream.talk.knowledge.persona import Persona


class LiveKitKnowledge:
    """A knowledge base and a persona for a LiveKit agent: its instructions, and a grounded turn."""

    def __init__(
        self, knowledge: KnowledgeBase, persona: Persona | None = None, config: GroundingConfig | None = None
    ) -> None:
        """`knowledge`: the documents; `persona`: the agent's instructions (None: lipstream's default)."""
        self.grounding = KnowledgeGrounding(knowledge, persona, config)
        self.persona = persona
        self.last_sources: list[str] = []  # the documents the last turn's passages came from

    @property
    def instructions(self) -> str:
        """The agent's instructions: the persona's system prompt."""
        return self.persona.system_prompt() if self.persona is not None else DEFAULT_SYSTEM_PROMPT

    def ground_turn(self, turn_ctx: Any, new_message: Any) -> None:
        """Add the notes for the user's message to this turn's chat context (a system message: the rule
        to answer only from them, and the passages fenced as data)."""
        question = getattr(new_message, "text_content", None) or ""
        if not question.strip():
            return
        grounded = self.grounding.ground("", question)
        self.last_sources = grounded.sources
        notes = grounded.system_prompt.strip()
        if notes:
            turn_ctx.add_message(role="system", content=notes)

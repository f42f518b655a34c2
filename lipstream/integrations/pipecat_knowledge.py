"""Pipecat: answers from the user's documents and a persona, in the user's own LLM pipeline.

Put it just before the LLM service, after the user context aggregator:

    knowledge = LipstreamKnowledge(KnowledgeBase("notes/"), Persona.load("ada.toml"))
    Pipeline([transport.input(), stt, user_agg, knowledge, llm, tts, LipstreamAvatar("anchor"), ...])

Interim transcriptions start retrieval while the user speaks (`prefetch`); each LLM context that goes by gets
its system message replaced by the grounded prompt (the persona's instructions, the rule to answer only
from the notes, the best passages fenced as data). The guard on the reply is the conversation's (lipstream's
own Talk mode); here the LLM's words go to TTS as they come.
"""

from __future__ import annotations

from typing import Any

try:
    from pipecat.frames import frames as pf
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
except ImportError as exc:  # the adapter is optional; say how to get it
    raise ImportError(
        "lipstream's Pipecat knowledge processor needs pipecat-ai: pip install 'lipstream[pipecat]'"
    ) from exc

from lipstream.talk.conversation_types import DEFAULT_SYSTEM_PROMPT
from lipstream.talk.knowledge.grounding import GroundingConfig, KnowledgeGrounding
from lipstream.talk.knowledge.index import KnowledgeBase
from lipstream.talk.knowledge.persona import Persona


class LipstreamKnowledge(FrameProcessor):
    """Grounds each LLM context in the knowledge base: the system message becomes the grounded prompt."""

    def __init__(
        self,
        knowledge: KnowledgeBase,
        persona: Persona | None = None,
        *,
        config: GroundingConfig | None = None,
        **kwargs: Any,
    ) -> None:
        """`knowledge`: the documents (shared between pipelines); `persona`: whose instructions open the
        prompt (None: the context's own system message, or lipstream's default)."""
        super().__init__(**kwargs)
        self.grounding = KnowledgeGrounding(knowledge, persona, config)
        self.persona = persona
        self.last_sources: list[str] = []  # the documents the last answer's passages came from

    async def process_frame(self, frame: pf.Frame, direction: FrameDirection) -> None:
        """Prefetch on interim transcriptions; ground the system message of each LLM context."""
        await super().process_frame(frame, direction)
        if isinstance(frame, pf.InterimTranscriptionFrame):
            self.grounding.prefetch(frame.text)
        else:
            context = getattr(frame, "context", None)
            if context is not None and hasattr(context, "get_messages") and hasattr(context, "set_messages"):
                self._ground(context)
        await self.push_frame(frame, direction)

    def _ground(self, context: Any) -> None:
        messages = list(context.get_messages())
        question = next((_text(m) for m in reversed(messages) if _role(m) == "user"), "")
        if not question:
            return
        own = next((_text(m) for m in messages if _role(m) == "system"), None)
        base = self.persona.system_prompt() if self.persona is not None else own or DEFAULT_SYSTEM_PROMPT
        grounded = self.grounding.ground(base, question)
        self.last_sources = grounded.sources
        system = {"role": "system", "content": grounded.system_prompt}
        rest = [m for m in messages if _role(m) != "system"]
        context.set_messages([system, *rest])


def _role(message: Any) -> str | None:
    return message.get("role") if isinstance(message, dict) else getattr(message, "role", None)


def _text(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else getattr(message, "content", None)
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI's content parts
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""

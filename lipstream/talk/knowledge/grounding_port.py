"""What a conversation asks of a knowledge source: passages for the prompt, and a guard on the reply.

The conversation calls `prefetch` with each partial transcript while the user speaks (retrieval then costs
the turn nothing), `ground` once the final transcript is known, and passes the reply's sentences through
`guard` before they are spoken.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class GroundedPrompt:
    """The system prompt with the passages that answer one question, and where they came from."""

    system_prompt: str  # everything in one system message (for stacks that take one)
    passages: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # the documents the passages came from
    # the same split for a model's prompt cache: `instructions` (the same every turn) as the system message,
    # `notes` (this question's passages) in the user's message before the question; "" = use system_prompt
    instructions: str = ""
    notes: str = ""


class Grounding(Protocol):
    """A knowledge source as the conversation uses it (lipstream.talk.knowledge.index implements it)."""

    def prefetch(self, partial_text: str) -> None:
        """Start (or refresh) retrieval for the question heard so far; cheap, never blocks the turn."""

    def ground(self, system_prompt: str, user_text: str) -> GroundedPrompt:
        """The system prompt with the best passages for the final transcript, within the context budget."""

    def guard(self, grounded: GroundedPrompt, sentences: AsyncIterator[str]) -> AsyncIterator[str]:
        """The reply's sentences as they come, or the passages' best sentence where the model strays."""

    def fallback(self, grounded: GroundedPrompt) -> str | None:
        """What `guard` says instead of a reply that strays (the unknown answer where no passage answers);
        None where the model's words pass. The conversation keeps a decline's speech synthesised."""

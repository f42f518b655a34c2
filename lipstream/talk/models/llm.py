"""Language models for the conversation: the LanguageModel interface, its messages and its error."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from lipstream.errors import LipstreamError

if TYPE_CHECKING:
    from lipstream.talk.models.model_process import ProcessStatus

Role = Literal["system", "user", "assistant"]
DEFAULT_MAX_TOKENS = 120  # a spoken answer: a few sentences


class LLMError(LipstreamError):
    """The language model failed: endpoint refused or unreachable, timed out, or answered garbage."""


@dataclass(frozen=True)
class ChatMessage:
    """One message of a chat: who said it and what."""

    role: Role
    content: str

    def to_dict(self) -> dict[str, str]:
        """The OpenAI chat-completions shape: {"role": ..., "content": ...}."""
        return {"role": self.role, "content": self.content}


def as_spoken(text: str) -> str:
    """The user's words as the language model gets them: without the final punctuation speech recognition
    guessed ("?" lands on a fragment as readily as on a question), so the end-of-turn judge and the answer
    read the same prompt (and the model's cache serves both)."""
    return text.strip().rstrip("?.!,;: ")


@runtime_checkable
class LanguageModel(Protocol):
    """A chat model that streams its reply as text deltas.

    `stream` is an async generator; cancelling the task that iterates it (or closing the generator) stops
    generation promptly and frees its resources. Failures raise LLMError with a one-line message.
    """

    name: str

    def stream(self, messages: list[ChatMessage], max_tokens: int = DEFAULT_MAX_TOKENS) -> AsyncIterator[str]:
        """Yield the reply to `messages` (system prompt first, then the history) as text deltas."""

    async def aclose(self) -> None:
        """Release connections, threads and memory."""


@runtime_checkable
class ReadsAhead(Protocol):
    """A model that can read a prompt's beginning before the rest is known (its prompt cache keeps it)."""

    async def prefill(self, messages: list[ChatMessage]) -> None:
        """Read `messages` (the last one the start of the user's message) into the cache; no reply."""


@runtime_checkable
class YieldsCores(Protocol):
    """A model running on this machine that can stop for a moment so something more urgent gets its core."""

    def pause(self, seconds: float) -> None:
        """Stop computing for at most `seconds` (or until `resume`); its replies wait, nothing is lost."""

    def resume(self) -> None:
        """Go on (a no-op when not paused)."""


@runtime_checkable
class ReportsProcess(Protocol):
    """A model served by a supervised process of its own (the embedded one), whose state /healthz shows."""

    def status(self) -> ProcessStatus:
        """The process's state, restarts and pid."""

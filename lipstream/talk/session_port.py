"""What a conversation needs from the avatar session it talks through (the render room's RenderSession).

The talk room never imports the render room: a Conversation is handed any object with this shape."""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable
from typing import Protocol

from lipstream.audio.speech import Speech


class SessionPort(Protocol):
    """The seam between a conversation and the session that shows its answers (a RenderSession has it)."""

    async def push_speech_stream(
        self, speeches: AsyncIterable[Speech], on_utterance: Callable[[int], None] | None = None
    ) -> int:
        """Speak sentences as one utterance; returns its id (`on_utterance` gets it at once)."""

    def interrupt(self) -> int:
        """Stop speaking now; returns the pts (samples) where speech was cut."""

    def is_speaking(self) -> bool:
        """True while speech is pending or still playing."""

    def playback_position(self) -> int:
        """The pts (samples) the client plays now."""

    def heard_text(self, utterance_id: int, until_pts: int) -> str:
        """What an utterance said before `until_pts`."""

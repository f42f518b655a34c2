"""The live sessions of one server (or one worker of it): slot accounting and the stats shown at
/api/sessions."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lipstream.server.protocol import ClientStats
from lipstream.server.tally import SharedTally

if TYPE_CHECKING:  # types only: the render room is imported where sessions are made
    from lipstream.render.session import RenderSession


@dataclass
class SessionRecord:
    """What the server knows about one live session."""

    session_id: str
    avatar: str
    started_at: float = field(default_factory=time.time)
    session: RenderSession | None = None  # the render Session once it is running
    client_stats: ClientStats | None = None
    messages_in: int = 0
    errors_sent: int = 0
    frames_sent: int = 0
    going_away: Callable[[], Awaitable[None]] | None = None  # closes the session with 1001 (server leaving)

    def summary(self) -> dict[str, Any]:
        """JSON-ready view for the admin endpoint."""
        server_stats: dict[str, Any] = self.session.stats.as_dict() if self.session is not None else {}
        return {
            "session_id": self.session_id,
            "avatar": self.avatar,
            "age_seconds": round(time.time() - self.started_at, 3),
            "frames_sent": self.frames_sent,
            "messages_in": self.messages_in,
            "errors_sent": self.errors_sent,
            "server": server_stats,
            "client": None if self.client_stats is None else self.client_stats.model_dump(exclude={"type"}),
        }


class SessionRegistry:
    """Holds at most `capacity` sessions; a slot is reserved before any work is done for a session. With a
    `tally` (serve --workers N) the capacity is the whole server's: every worker's sessions count."""

    def __init__(self, capacity: int, tally: SharedTally | None = None) -> None:
        self.capacity = capacity
        self.tally = tally
        self._records: dict[str, SessionRecord] = {}

    def __len__(self) -> int:
        return len(self._records)

    def reserve(self, avatar: str) -> SessionRecord | None:
        """A new record, or None when the server is full."""
        if len(self._records) >= self.capacity:
            return None
        if self.tally is not None and not self.tally.try_add(len(self._records), self.capacity):
            return None  # the other workers hold the rest of the server's sessions
        record = SessionRecord(session_id=uuid.uuid4().hex[:12], avatar=avatar)
        self._records[record.session_id] = record
        return record

    def release(self, session_id: str) -> None:
        """Forget a session (idempotent)."""
        self._records.pop(session_id, None)
        if self.tally is not None:
            self.tally.set(len(self._records))

    async def close_all(self, timeout: float = 5.0) -> int:
        """Close every live session with 1001 (this server is going away); how many were told."""
        closers = [r.going_away() for r in list(self._records.values()) if r.going_away is not None]
        if closers:
            await asyncio.wait_for(asyncio.gather(*closers, return_exceptions=True), timeout)
        return len(closers)

    def total(self) -> int:
        """Live sessions of the whole server (this registry's alone without a tally)."""
        return self.tally.total() if self.tally is not None else len(self._records)

    def summaries(self) -> list[dict[str, Any]]:
        """Admin view of every live session."""
        return [r.summary() for r in self._records.values()]

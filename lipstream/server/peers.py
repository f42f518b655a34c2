"""The workers of one `serve --workers N` server answer for each other at /metrics and /api/sessions.

Each worker serves a snapshot of itself (its metric samples and session summaries, as JSON) on a Unix
socket in the server's private folder; the worker a request lands on reads every other worker's snapshot
and merges them with its own. The snapshot is read live, so a session opened a moment ago on another
worker is already in it. A worker that does not answer (dead, restarting) is left out of that answer."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lipstream.server.metrics import ServerMetrics, sum_expositions
from lipstream.server.session_registry import SessionRegistry

log = logging.getLogger(__name__)

SNAPSHOT_LIMIT = 64 * 1024 * 1024  # a snapshot larger than this is not read (thousands of sessions)


def socket_path(folder: Path, index: int) -> Path:
    """Where worker `index` serves its snapshot."""
    return folder / f"worker-{index}.sock"


@dataclass
class WorkerPeers:
    """This worker's view of the whole server: its own snapshot served, the others' read on demand."""

    folder: Path
    index: int
    workers: int
    metrics: ServerMetrics
    registry: SessionRegistry
    timeout: float = 2.0
    _server: asyncio.AbstractServer | None = field(default=None, init=False, repr=False)

    def snapshot(self) -> dict[str, Any]:
        """This worker's metric samples and session summaries (each summary names the worker)."""
        sessions = [{**s, "worker": self.index} for s in self.registry.summaries()]
        return {"worker": self.index, "pid": os.getpid(), "metrics": self.metrics.render().decode(),
                "sessions": sessions}  # fmt: skip

    async def start(self) -> None:
        """Serve the snapshot on this worker's socket (a predecessor's stale socket is replaced)."""
        path = socket_path(self.folder, self.index)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._server = await asyncio.start_unix_server(self._answer, path=str(path))

    async def _answer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            writer.write(json.dumps(self.snapshot()).encode())
            await writer.drain()
        except (ConnectionError, OSError):
            pass  # the asking worker gave up (its timeout) or died
        finally:
            writer.close()

    async def _read_peer(self, index: int) -> dict[str, Any] | None:
        try:
            async with asyncio.timeout(self.timeout):
                reader, writer = await asyncio.open_unix_connection(str(socket_path(self.folder, index)))
                try:
                    data = await reader.read(SNAPSHOT_LIMIT)
                    while chunk := await reader.read(SNAPSHOT_LIMIT):
                        data += chunk
                finally:
                    writer.close()
            return json.loads(data)
        except (OSError, TimeoutError, ValueError) as exc:
            log.debug("worker %d: no snapshot from worker %d (%s)", self.index, index, exc)
            return None

    async def gather(self) -> list[dict[str, Any]]:
        """Every answering worker's snapshot, this one's first."""
        others = [i for i in range(self.workers) if i != self.index]
        answers = await asyncio.gather(*(self._read_peer(i) for i in others))
        return [self.snapshot(), *(a for a in answers if a is not None)]

    async def exposition(self) -> bytes:
        """/metrics for the whole server: every worker's samples summed."""
        return sum_expositions(s["metrics"] for s in await self.gather())

    async def sessions(self) -> list[dict[str, Any]]:
        """/api/sessions for the whole server."""
        return [summary for s in await self.gather() for summary in s["sessions"]]

    def health(self) -> dict[str, Any]:
        """/healthz fields: the server's live sessions (all workers), the worker count and this worker."""
        return {"sessions": self.registry.total(), "workers": self.workers, "worker": self.index}

    async def close(self) -> None:
        """Stop serving the snapshot and remove the socket."""
        if self._server is not None:
            self._server.close()
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            socket_path(self.folder, self.index).unlink()

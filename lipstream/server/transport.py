"""HTTP connection guards under uvicorn: a cap on open connections and a deadline for a request head.

uvicorn applies its keep-alive timeout only after a response, so a socket that connects and sends
nothing (or one byte a second) would stay open for ever; a thousand of them exhaust file descriptors.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from lipstream.server.config import Limits
from lipstream.server.tally import SharedTally

log = logging.getLogger(__name__)

_BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain\r\nconnection: close\r\n"
    b"content-length: 37\r\n\r\ntoo many connections; try again later\n"
)


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, plus: over `max_connections` open connections a new one gets 503 and
    is closed; a request head not complete within `header_timeout` seconds closes the connection. With a
    `tally` (serve --workers N) the cap counts every worker's connections."""

    max_connections = 64
    header_timeout = 10.0
    tally: SharedTally | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Refuse the connection when the server is at its cap, else arm the head deadline."""
        self._head_timer: asyncio.TimerHandle | None = None
        own = len(self.connections)
        if own >= self.max_connections or (
            self.tally is not None and not self.tally.try_add(own, self.max_connections)
        ):
            log.warning("refusing a connection: %d open (the cap)", len(self.connections))
            transport.write(_BUSY_RESPONSE)
            transport.close()
            self.transport = transport
            return
        super().connection_made(transport)
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection (also one refused at the cap, which was never counted)."""
        self._cancel_head_timer()
        if self not in self.connections:
            return
        super().connection_lost(exc)
        if self.tally is not None:
            self.tally.set(len(self.connections))

    def data_received(self, data: bytes) -> None:
        """Ignore bytes of a connection refused at the cap; bytes with no request in flight start the
        deadline (a client that trickles blank lines or an unread body after a response is closed too)."""
        if self not in self.connections:
            return
        if self.cycle is None or self.cycle.response_complete:
            self._arm_head_timer()
        super().data_received(data)

    def on_message_begin(self) -> None:
        """A request starts: its head must be complete within the deadline."""
        super().on_message_begin()
        self._arm_head_timer()

    def on_headers_complete(self) -> None:
        """The head arrived in time."""
        self._cancel_head_timer()
        super().on_headers_complete()

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        timer = getattr(self, "_head_timer", None)
        if timer is not None:
            timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        # after a WebSocket upgrade the transport belongs to the WebSocket protocol: leave it alone
        if self.transport.get_protocol() is self and not self.transport.is_closing():
            log.info("closing a connection that sent no complete request head in %.0f s", self.header_timeout)
            self.transport.close()


def guarded_http_protocol(limits: Limits, tally: SharedTally | None = None) -> type[GuardedHttpProtocol]:
    """The protocol class for uvicorn's `http=` option, with this server's limits (`tally`: the workers'
    shared connection counts; a WebSocket's close is published by the worker's periodic refresh, as it no
    longer passes through this protocol)."""
    return type(
        "GuardedHttpProtocol",
        (GuardedHttpProtocol,),
        {
            "max_connections": limits.max_connections, "header_timeout": limits.header_timeout_seconds,
            "tally": tally,
        },
    )  # fmt: skip

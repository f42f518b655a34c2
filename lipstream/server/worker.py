"""One worker process of `serve --workers N` (`python -m lipstream.server.worker`, started by
lipstream.server.workers): it loads its own engine and voice, serves the app on the listening socket the
supervisor bound and handed down, and answers /metrics and /api/sessions for the whole server."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from lipstream.errors import LipstreamError
from lipstream.server.config import ServerConfig

LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"
CONNECTIONS_REFRESH_S = 0.25  # how soon a closed WebSocket frees its place under --max-connections


class WorkerSpec(BaseModel):
    """What the supervisor tells a worker (on its stdin: the token never shows in a process listing)."""

    config: ServerConfig
    engine_options: dict[str, Any] = Field(default_factory=dict)
    index: int = Field(ge=0)
    workers: int = Field(ge=1)
    folder: Path  # the server's private folder: shared counts, the workers' snapshot sockets
    listen_fd: int  # the listening socket, inherited
    ready_fd: int  # a pipe: one byte once this worker accepts connections
    parent_pid: int
    log_level: int = logging.WARNING


def sessions_tally_path(folder: Path) -> Path:
    """The workers' shared live-session counts."""
    return folder / "sessions.count"


def connections_tally_path(folder: Path) -> Path:
    """The workers' shared open-connection counts."""
    return folder / "connections.count"


async def _publish_connections(server: Any, tally: Any) -> None:
    # a WebSocket's close does not pass through the HTTP protocol that counts connections: publish the
    # live figure a few times a second so the whole-server cap sees it
    while True:
        tally.set(len(server.server_state.connections))
        await asyncio.sleep(CONNECTIONS_REFRESH_S)


async def serve_worker(spec: WorkerSpec) -> int:
    """Load, serve on the inherited socket until told to stop, then clean up this worker's files."""
    from lipstream.server.app import create_app
    from lipstream.server.launch import load_serving, uvicorn_server
    from lipstream.server.peers import WorkerPeers
    from lipstream.server.session_registry import SessionRegistry
    from lipstream.server.tally import SharedTally

    config = spec.config
    loaded = load_serving(config, spec.engine_options)
    sessions = SharedTally(sessions_tally_path(spec.folder), spec.workers, spec.index)
    connections = SharedTally(connections_tally_path(spec.folder), spec.workers, spec.index)
    sessions.set(0)  # a predecessor that died may have left counts behind
    connections.set(0)
    registry = SessionRegistry(config.limits.max_sessions, tally=sessions)
    peers = WorkerPeers(spec.folder, spec.index, spec.workers, loaded.metrics, registry)
    app = create_app(
        config, loaded.engine, loaded.factory, heap=loaded.heap, metrics=loaded.metrics, health=peers.health,
        exposition=peers.exposition, registry=registry, all_sessions=peers.sessions,
    )  # fmt: skip
    server = uvicorn_server(app, config, connections)
    listener = socket.socket(fileno=spec.listen_fd)
    await peers.start()
    refresher = asyncio.create_task(_publish_connections(server, connections))
    # uvicorn handles SIGTERM while it serves, then raises it again once it has shut down: ignored then,
    # so this worker's files are cleaned up below instead of the process ending mid-way
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        task = asyncio.create_task(server.serve(sockets=[listener]))
        while not server.started and not task.done():
            await asyncio.sleep(0.05)
        if server.started:
            os.write(spec.ready_fd, b"r")
        os.close(spec.ready_fd)
        await task
    finally:
        refresher.cancel()
        await peers.close()
        sessions.set(0)
        connections.set(0)
    return 0 if server.started else 1


def main() -> int:
    """The worker's entry point: read the spec, die with the supervisor, serve."""
    spec = WorkerSpec.model_validate_json(sys.stdin.read())
    from lipstream.talk.models.child_serving import die_with_parent

    die_with_parent(spec.parent_pid)  # a worker never outlives its supervisor, even one killed with -9
    logging.basicConfig(level=spec.log_level, format=LOG_FORMAT)
    try:
        return asyncio.run(serve_worker(spec))
    except LipstreamError as exc:  # a user error (missing engine weights ...): one line, as `serve` says it
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())

"""What one serving process loads before it listens (engine, voice, metrics, session factory) and the
uvicorn server around its app: shared by the single-process `serve` and each worker of `serve --workers N`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lipstream.heap import HeapTrimmer
from lipstream.server.config import Limits, ServerConfig
from lipstream.server.metrics import ServerMetrics
from lipstream.server.tally import SharedTally

if TYPE_CHECKING:  # the app module pulls FastAPI in; only its type is needed here
    from lipstream.server.app import LiveSessionFactory


@dataclass
class Loaded:
    """A process's serving parts, loaded and warmed before any connection is accepted."""

    heap: HeapTrimmer
    engine: Any
    metrics: ServerMetrics
    factory: LiveSessionFactory


def load_serving(config: ServerConfig, engine_options: dict[str, Any]) -> Loaded:
    """Tune the heap, load the engine and the voice (not on the first request), make the session factory."""
    from lipstream.engines.registry import create_engine
    from lipstream.server.app import render_session_factory
    from lipstream.talk.voices.shared import SharedVoices

    heap = HeapTrimmer()
    heap.tune()  # before any worker thread exists
    engine = create_engine(config.engine, **engine_options)
    voices = SharedVoices()
    voices(config.voice)  # load the voice now, not on the first speak request
    metrics = ServerMetrics()
    engine = batched(engine, config, metrics)
    factory = render_session_factory(config, voices, metrics=metrics)
    return Loaded(heap=heap, engine=engine, metrics=metrics, factory=factory)


def batched(engine: Any, config: ServerConfig, metrics: ServerMetrics) -> Any:
    """The engine behind a cross-session batcher when it is a neural one and batching is on (every batch
    size built and warmed now, before the server takes traffic); else the engine as it is."""
    from lipstream.engines.base import BatchesAcrossSessions
    from lipstream.engines.batched import BatchedEngine
    from lipstream.engines.batcher import BatchConfig

    if not config.batching or not isinstance(engine, BatchesAcrossSessions):
        return engine
    batch = BatchConfig(batch_sizes=config.batch_sizes, max_wait_ms=config.max_batch_wait_ms)
    return BatchedEngine(engine, batch, observer=metrics)


def uvicorn_server(app: Any, config: ServerConfig, connections: SharedTally | None = None) -> Any:
    """The uvicorn server for `app` with this server's limits (`connections`: the workers' shared count)."""
    import uvicorn

    from lipstream.server.transport import guarded_http_protocol

    limits: Limits = config.limits
    return uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            ws_max_size=limits.transport_max_bytes,
            ws_per_message_deflate=False,  # media does not compress; deflate only costs CPU
            http=guarded_http_protocol(limits, connections),  # a cap on connections, a head deadline
            log_level="warning",
            lifespan="off",
        )
    )


def serving_line(config: ServerConfig, port: int) -> str:
    """The one line `serve` prints once it listens (scripts and tests read the URL from it)."""
    suffix = f"/?token={config.token}" if config.token else "/"
    return f"lipstream serving at http://{config.host}:{port}{suffix}"

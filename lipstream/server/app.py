"""The FastAPI app: health, avatars, admin stats, the player page, and the /ws session endpoint."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from lipstream import __version__
from lipstream.avatar.bundle import AvatarBundle, SharedBundles, list_avatars, load_avatar
from lipstream.engines.base import ReportsStatus
from lipstream.errors import LipstreamError
from lipstream.heap import HeapTrimmer
from lipstream.render.base_frames import SharedBaseFrames
from lipstream.render.idle_gops import SharedIdleGops
from lipstream.render.workers import WorkerPools
from lipstream.server.auth import extract_token, token_ok
from lipstream.server.config import ServerConfig
from lipstream.server.connection import Connection, SessionFactory
from lipstream.server.edge_routes import EdgeExports, add_edge_routes
from lipstream.server.metrics import CONTENT_TYPE, ServerMetrics
from lipstream.server.poster import add_poster_route
from lipstream.server.session_registry import SessionRegistry
from lipstream.server.tts_http import add_tts_routes
from lipstream.talk.voices.shared import SharedVoices
from lipstream.talk.voices.speaker import Speaker

if TYPE_CHECKING:  # the agent is built (and its talk/ modules imported) only with --agent
    from lipstream.talk.agent import AgentServices

STATIC_DIR = Path(__file__).resolve().parent.parent / "web" / "static"
EDGE_PAGE_DIR = STATIC_DIR.parent / "edge"
# served at /static/edge/ (patch mode)
SHARED_EDGE_MODULES = frozenset({"compositor.js", "files.js", "lids.js"})


@dataclass
class LiveSessionFactory:
    """Makes the server's sessions (H.264 for the wire) and holds what they share: voices, the speaker
    that turns `speak` text into speech, worker pools, scaled base frames, encoded idle loops and the
    metrics observer."""

    config: ServerConfig
    voices: SharedVoices
    pools: WorkerPools
    metrics: ServerMetrics | None = None
    base_frames: SharedBaseFrames = field(default_factory=SharedBaseFrames)
    idle_gops: SharedIdleGops = field(default_factory=SharedIdleGops)

    def __post_init__(self) -> None:
        # sentences are synthesised on the low-priority speech pool, like the sessions' feature extraction
        self.speaker = Speaker(self.voices, executor=self.pools.speech, default_voice=self.config.voice)

    def __call__(self, bundle: AvatarBundle, engine: Any, output_width: int | None, stream: str = "full"):
        """A session of `bundle` on the shared `engine`, at `output_width` (None: the avatar's size)."""
        from lipstream.render.session import RenderSession, SessionConfig

        cfg = SessionConfig(
            encode=True,
            output_width=output_width,
            voice=self.config.voice,
            max_lead_seconds=self.config.max_lead_seconds,
            max_pending_seconds=self.config.limits.max_pending_seconds,
            stream=stream,
            patch_bitrate=self.config.patch_bitrate,
        )
        return RenderSession(
            bundle, engine, cfg, pools=self.pools, base_frames=self.base_frames, idle_gops=self.idle_gops,
            observer=self.metrics,
        )  # fmt: skip


def render_session_factory(
    config: ServerConfig,
    voices: SharedVoices | None = None,
    pools: WorkerPools | None = None,
    metrics: ServerMetrics | None = None,
) -> LiveSessionFactory:
    """The server's session factory: voices, worker pools and scaled base frames shared by all sessions;
    `metrics` observes their render stages, TTFF and late frames."""
    return LiveSessionFactory(
        config,
        voices or SharedVoices(),
        pools or WorkerPools.create(render_threads=config.limits.max_sessions),
        metrics,
    )


def _avatar_info(name: str, root: Path | None) -> dict[str, Any] | None:
    try:
        manifest = load_avatar(name, root).manifest
    except LipstreamError:
        return None  # a broken bundle is not offered
    return {
        "name": name,
        "width": manifest.width,
        "height": manifest.height,
        "frame_count": manifest.frame_count,
    }


def create_app(
    config: ServerConfig,
    engine: Any,
    session_factory: SessionFactory | None = None,
    heap: HeapTrimmer | None = None,
    agent: AgentServices | None = None,
    metrics: ServerMetrics | None = None,
    health: Callable[[], dict[str, Any]] | None = None,
    exposition: Callable[[], Awaitable[bytes]] | None = None,
    registry: SessionRegistry | None = None,
    all_sessions: Callable[[], Awaitable[list[dict[str, Any]]]] | None = None,
) -> FastAPI:
    """Build the app around one shared engine instance; `heap` is trimmed after each session ends;
    `agent` (AgentServices) lets sessions ask for a conversation; `metrics` (own registry) is served at
    /metrics, or `exposition()` when given (a Ray replica answers for every replica); `health` adds fields to
    /healthz (a Ray replica's id and the cluster's failed warm-ups; a worker's whole-server session count);
    `registry` holds the sessions (one whose capacity the workers of `serve --workers N` share), and
    `all_sessions()` lists them at /api/sessions for the whole server (every worker's)."""
    # no /openapi.json: the API is documented in docs/protocol.md, and nothing is served without the token
    # that does not have to be
    app = FastAPI(title="lipstream", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    registry = registry if registry is not None else SessionRegistry(config.limits.max_sessions)
    edge_exports = EdgeExports(config.avatars_dir)  # base loops for the serverless page and patch streams
    metrics = metrics or ServerMetrics()
    metrics.bind_live_sessions(lambda: len(registry))
    model_status = agent.model_status if agent is not None else None
    if model_status is not None:
        metrics.bind_language_model(model_status)
    if agent is not None and agent.seats is not None:
        metrics.bind_conversation_seats(agent.seat_status)
    factory = session_factory or render_session_factory(config, metrics=metrics)
    if not isinstance(factory, LiveSessionFactory):  # a caller's own factory: text gets its own voices
        factory_speaker = Speaker(SharedVoices(), default_voice=config.voice)
        pools = WorkerPools()
    else:
        factory_speaker, pools = factory.speaker, factory.pools
    voices = factory_speaker.voices  # one loaded voice for sessions and POST /api/tts
    if agent is not None and agent.greeting:  # every Talk session starts with it: synthesised once, now
        factory_speaker.keep(agent.greeting, agent.voice)
    bundles = SharedBundles(config.avatars_dir)  # one open bundle per avatar for all sessions
    app.state.registry = registry
    app.state.metrics = metrics

    def authorized(request: Request) -> bool:
        return token_ok(config.token, extract_token(request.headers, request.query_params))

    def unauthorized() -> JSONResponse:
        body = {
            "error": "unauthorized",
            "message": "missing or wrong token; send Authorization: Bearer TOKEN",
        }
        return JSONResponse(body, status_code=401)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        """Liveness: version, engine, live session count and the language model process's state."""
        body = {
            "status": "ok", "version": __version__, "engine": config.engine, "sessions": len(registry),
            "agent": agent is not None, **(health() if health is not None else {}),
        }
        if model_status is not None and (model := model_status()) is not None:
            body["language_model"] = model
        if agent is not None:
            body["turn"] = agent.turn_status()
            if (seats := agent.seat_status()) is not None:
                body["conversations"] = seats
            if known := agent.knowledge_status():
                body.update(known)  # the persona's name (the page shows it) and the knowledge index
        if isinstance(engine, ReportsStatus):  # the neural engine's batcher: sizes, warm-up, passes
            body["batching"] = engine.status()
        return body

    @app.get("/metrics")
    async def prometheus_metrics(request: Request) -> Any:
        """Prometheus text exposition (token-protected like /api when the server has one)."""
        if not authorized(request):
            return unauthorized()
        body = await exposition() if exposition is not None else metrics.render()
        return Response(body, media_type=CONTENT_TYPE)

    @app.get("/api/avatars")
    async def avatars(request: Request) -> Any:
        """The avatars a session can open."""
        if not authorized(request):
            return unauthorized()
        names = list_avatars(config.avatars_dir)
        infos = [info for info in (_avatar_info(n, config.avatars_dir) for n in names) if info]
        return {"avatars": infos}

    @app.get("/api/sessions")
    async def sessions(request: Request) -> Any:
        """Admin view: live sessions with server and client-reported stats."""
        if not authorized(request):
            return unauthorized()
        live = await all_sessions() if all_sessions is not None else registry.summaries()
        return {"sessions": live, "max_sessions": config.limits.max_sessions}

    @app.get("/")
    async def page() -> FileResponse:
        """The player page."""
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-store"})

    @app.get("/static/edge/{module}")
    async def edge_module(module: str) -> Response:
        """The serverless page's modules the live player's patch mode imports (one compositor, two pages)."""
        if module not in SHARED_EDGE_MODULES:
            return JSONResponse({"error": "not_found", "message": f"no module {module}"}, status_code=404)
        return FileResponse(EDGE_PAGE_DIR / module, media_type="text/javascript")

    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    add_edge_routes(app, edge_exports, config.token)  # the serverless page at /edge/NAME/
    add_tts_routes(app, voices, config.voice, config.limits.max_text_chars, authorized)  # its text fallback
    add_poster_route(app, bundles, authorized)  # the avatar's idle picture: the page shows it before Start

    @app.websocket("/ws")
    async def session_socket(ws: WebSocket) -> None:
        """One live session per connection (docs/protocol.md)."""
        await Connection(
            ws, config, engine, registry, factory, agent=agent, metrics=metrics, edge_exports=edge_exports,
            speaker=factory_speaker, pools=pools, bundles=bundles,
        ).run()  # fmt: skip
        if heap is not None:
            await asyncio.to_thread(heap.trim)

    return app

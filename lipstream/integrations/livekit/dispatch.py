"""The avatar worker's front door: an HTTP endpoint the agent calls to send an avatar into its room.

The agent (`AvatarSession.start`) mints a LiveKit access token for the avatar participant with its API
key and secret and POSTs it to `/launch` with the room name, as LiveKit's own avatar examples hand a
dispatcher a token. The worker holds the same key and secret: it verifies the token's signature and room
grant before joining, so nobody without the secret can make it join anything, then joins with that token
on its own `--url`. One avatar (one Session) per room, in this process.

    POST /launch   {"room": "...", "token": "<jwt>", "avatar": "anchor"?, "agent_identity": "..."?}
                   202 {"room", "identity", "avatar"} | 400 bad body | 401 bad token | 404 unknown avatar
                   | 409 an avatar is already in that room
    GET  /rooms    {"active": [room, ...], "failed": {room: reason}}
    GET  /health   "ok"
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable

from aiohttp import web
from livekit import api
from pydantic import BaseModel, ValidationError

from lipstream.avatar.bundle import list_avatars
from lipstream.integrations.livekit.generator import DEFAULT_SAMPLE_RATE, LipstreamVideoGenerator
from lipstream.integrations.livekit.room import run_avatar_in_room

log = logging.getLogger(__name__)

AVATAR_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # a name under $LIPSTREAM_HOME, never a path
Join = Callable[..., Awaitable[None]]
SHUTDOWN_S = 5.0  # how long a stopping worker waits for open HTTP requests (aiohttp's default: 60 s)


class LaunchRequest(BaseModel):
    """What the agent sends to /launch."""

    room: str
    token: str
    avatar: str | None = None  # default: the worker's --avatar
    agent_identity: str | None = None  # whose audio to play (default: the first agent in the room)


class WorkerSettings(BaseModel):
    """How the worker joins rooms and what it plays there."""

    url: str  # the LiveKit server (wss://...)
    api_key: str
    api_secret: str
    avatar: str  # played unless a launch names another prepared avatar
    engine: str = "viseme"
    output_width: int | None = None
    audio_sample_rate: int = DEFAULT_SAMPLE_RATE


class AvatarDispatcher:
    """Verifies launch requests and runs one avatar per room; `join` is what runs it (the real room
    runner by default)."""

    def __init__(self, settings: WorkerSettings, join: Join = run_avatar_in_room) -> None:
        """`settings`: the server, credentials and avatar; `join`: the coroutine that runs one room."""
        self.settings = settings
        self._join = join
        self._verifier = api.TokenVerifier(settings.api_key, settings.api_secret)
        self.active: dict[str, asyncio.Task] = {}
        self.failed: dict[str, str] = {}

    def app(self) -> web.Application:
        """The aiohttp application serving /launch, /rooms and /health."""
        app = web.Application()
        app.add_routes([
            web.post("/launch", self.handle_launch),
            web.get("/rooms", self.handle_rooms),
            web.get("/health", self.handle_health),
        ])  # fmt: skip
        app.on_shutdown.append(self._stop_all)
        return app

    async def handle_launch(self, request: web.Request) -> web.Response:
        """Check the request and its token, then start the avatar in that room."""
        try:
            launch = LaunchRequest.model_validate_json(await request.read())
        except ValidationError as exc:
            return _error(400, f"bad launch request: {exc.errors()[0]['loc']} {exc.errors()[0]['msg']}")
        try:
            claims = self._verifier.verify(launch.token)
        except Exception as exc:  # noqa: BLE001 - any failure (signature, expiry, format) is a refusal
            return _error(401, f"token refused ({exc}); mint it with this worker's API key and secret")
        grant = claims.video
        if grant is None or not grant.room_join or grant.room != launch.room:
            return _error(401, f"the token does not grant joining room '{launch.room}'")
        avatar = launch.avatar or self.settings.avatar  # the worker's own was checked at its start
        if launch.avatar is not None and (not AVATAR_NAME.match(avatar) or avatar not in list_avatars()):
            known = ", ".join(list_avatars()) or "none"
            return _error(404, f"unknown avatar '{avatar}' on this worker (known: {known})")
        if launch.room in self.active:
            return _error(409, f"an avatar is already in room '{launch.room}'")
        self.failed.pop(launch.room, None)
        task = asyncio.create_task(self._run(launch, avatar), name=f"avatar-{launch.room}")
        self.active[launch.room] = task
        return web.json_response(
            {"room": launch.room, "identity": claims.identity, "avatar": avatar}, status=202
        )

    async def handle_health(self, _request: web.Request) -> web.Response:
        """Liveness: the worker answers."""
        return web.Response(text="ok")

    async def handle_rooms(self, _request: web.Request) -> web.Response:
        """Rooms with an avatar now, and why the last attempt in a room failed."""
        return web.json_response({"active": sorted(self.active), "failed": self.failed})

    async def _run(self, launch: LaunchRequest, avatar: str) -> None:
        settings = self.settings
        try:
            await self._join(
                settings.url,
                launch.token,
                lambda: LipstreamVideoGenerator(
                    avatar, engine=settings.engine, output_width=settings.output_width
                ),
                audio_sample_rate=settings.audio_sample_rate,
                sender_identity=launch.agent_identity,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - one room's failure is reported, the worker goes on
            log.exception("avatar in room %s failed", launch.room)
            self.failed[launch.room] = f"{type(exc).__name__}: {exc}"
        finally:
            self.active.pop(launch.room, None)

    async def _stop_all(self, _app: web.Application) -> None:
        tasks = list(self.active.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


async def serve_dispatcher(dispatcher: AvatarDispatcher, host: str, port: int) -> web.AppRunner:
    """Start serving the dispatcher on host:port; returns the runner (`await runner.cleanup()` stops it)."""
    runner = web.AppRunner(dispatcher.app(), shutdown_timeout=SHUTDOWN_S)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    return runner

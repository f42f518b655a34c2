"""The agent side: `AvatarSession(...).start(agent_session, room)`, used like the hosted avatar plugins.

It asks a `lipstream livekit-worker` to send the avatar into the agent's room (a token for the avatar
participant, minted with the agent's API key and secret, POSTed to the worker's /launch), then routes the
agent's audio to that participant over a data stream (`DataStreamAudioOutput`): the avatar publishes
the audio and video; the agent publishes no audio of its own.
"""

from __future__ import annotations

import os
from typing import Any

import httpx
from livekit import api, rtc
from livekit.agents.types import ATTRIBUTE_PUBLISH_ON_BEHALF
from livekit.agents.voice.avatar import AvatarSession as LiveKitAvatarSession
from livekit.agents.voice.avatar import DataStreamAudioOutput

from lipstream.errors import LipstreamError
from lipstream.integrations.livekit.generator import DEFAULT_SAMPLE_RATE

DEFAULT_WORKER_URL = "http://127.0.0.1:8089"
DEFAULT_IDENTITY = "lipstream-avatar"


class AvatarSession(LiveKitAvatarSession):
    """A self-hosted lipstream avatar for a LiveKit agent (a drop-in for a hosted plugin's session)."""

    def __init__(
        self,
        *,
        avatar: str | None = None,
        worker_url: str = DEFAULT_WORKER_URL,
        avatar_identity: str = DEFAULT_IDENTITY,
        avatar_name: str = "lipstream avatar",
        sample_rate: int = DEFAULT_SAMPLE_RATE,
        api_key: str | None = None,
        api_secret: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        """`avatar`: a prepared avatar on the worker (default: the worker's --avatar); `worker_url`: where
        `lipstream livekit-worker` listens; `sample_rate`: the rate the agent's audio is sent at (the
        worker publishes at its --sample-rate: keep them equal); `api_key`/`api_secret`: default
        $LIVEKIT_API_KEY / $LIVEKIT_API_SECRET, the same the worker holds."""
        super().__init__()
        self._avatar = avatar
        self._worker_url = worker_url.rstrip("/")
        self._identity = avatar_identity
        self._name = avatar_name
        self._sample_rate = sample_rate
        self._api_key = api_key or os.environ.get("LIVEKIT_API_KEY")
        self._api_secret = api_secret or os.environ.get("LIVEKIT_API_SECRET")
        self._timeout = timeout

    @property
    def avatar_identity(self) -> str:
        """The avatar participant's identity in the room."""
        return self._identity

    @property
    def provider(self) -> str:
        """Shown in LiveKit's avatar metrics."""
        return "lipstream"

    async def start(self, agent_session: Any, room: rtc.Room) -> None:
        """Send the avatar into `room` and route `agent_session`'s audio to it (call before
        `agent_session.start`, after `ctx.connect()`)."""
        await super().start(agent_session, room)
        await self.dispatch(room.name, room.local_participant.identity)
        agent_session.output.replace_audio_tail(
            DataStreamAudioOutput(
                room,
                destination_identity=self._identity,
                sample_rate=self._sample_rate,
                wait_remote_track=rtc.TrackKind.KIND_VIDEO,  # replies wait until the face is published
                wait_playback_start=True,  # the worker's AvatarRunner reports playback_started
            )
        )

    def launch_request(self, room_name: str, agent_identity: str) -> dict[str, Any]:
        """The /launch body: the room, a token for the avatar participant, which avatar, whose audio."""
        if not self._api_key or not self._api_secret:
            raise LipstreamError(
                "the lipstream avatar needs the LiveKit API key and secret to mint its token: set "
                "LIVEKIT_API_KEY and LIVEKIT_API_SECRET, or pass api_key= and api_secret="
            )
        token = (
            api.AccessToken(self._api_key, self._api_secret)
            .with_identity(self._identity)
            .with_name(self._name)
            .with_kind("agent")
            .with_grants(api.VideoGrants(room_join=True, room=room_name))
            # LiveKit then attributes the avatar's tracks to the agent (transcripts, the playground)
            .with_attributes({ATTRIBUTE_PUBLISH_ON_BEHALF: agent_identity})
            .to_jwt()
        )
        body: dict[str, Any] = {"room": room_name, "token": token, "agent_identity": agent_identity}
        if self._avatar is not None:
            body["avatar"] = self._avatar
        return body

    async def dispatch(self, room_name: str, agent_identity: str) -> dict[str, Any]:
        """Ask the worker to join `room_name`; returns its answer, raises LipstreamError with its reason."""
        body = self.launch_request(room_name, agent_identity)
        url = f"{self._worker_url}/launch"
        try:
            async with httpx.AsyncClient(timeout=self._timeout) as client:
                response = await client.post(url, json=body)
        except httpx.HTTPError as exc:
            raise LipstreamError(
                f"cannot reach the lipstream avatar worker at {url} ({exc}); start it with "
                "`lipstream livekit-worker --avatar NAME` or pass worker_url="
            ) from exc
        if response.status_code != 202:
            try:
                reason = response.json().get("error", response.text)
            except ValueError:
                reason = response.text
            raise LipstreamError(
                f"the lipstream avatar worker refused the launch ({response.status_code}): {reason}"
            )
        return response.json()

"""One avatar in one LiveKit room: the `AvatarRunner` around a `LipstreamVideoGenerator`, fed by the agent's
audio data stream, until the agent leaves or the room closes. Needs a LiveKit server (none in our tests)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from livekit import rtc
from livekit.agents.voice.avatar import AvatarRunner, DataStreamAudioReceiver

from lipstream.integrations.livekit.generator import DEFAULT_SAMPLE_RATE, LipstreamVideoGenerator

log = logging.getLogger(__name__)


async def run_avatar_in_room(
    url: str,
    token: str,
    make_generator: Callable[[], LipstreamVideoGenerator],
    *,
    audio_sample_rate: int = DEFAULT_SAMPLE_RATE,
    sender_identity: str | None = None,
) -> None:
    """Join the room with `token`, publish the avatar's audio and video for the agent that sends it audio
    (`sender_identity`, default: the first agent participant), and return when the agent or the room
    goes away."""
    generator = await asyncio.to_thread(make_generator)  # reads the bundle: off the event loop
    room = rtc.Room()
    stopped = asyncio.Event()

    def on_participant_left(participant: rtc.RemoteParticipant) -> None:
        if sender_identity is not None and participant.identity == sender_identity:
            stopped.set()
        elif sender_identity is None and participant.kind == rtc.ParticipantKind.PARTICIPANT_KIND_AGENT:
            stopped.set()

    room.on("participant_disconnected", on_participant_left)
    room.on("disconnected", lambda *_: stopped.set())
    runner: AvatarRunner | None = None
    try:
        await generator.start()  # warm before joining: the first reply does not wait for it
        await room.connect(url, token)
        log.info("avatar joined room %s as %s", room.name, room.local_participant.identity)
        runner = AvatarRunner(
            room,
            audio_recv=DataStreamAudioReceiver(room, sender_identity=sender_identity),
            video_gen=generator,
            options=generator.avatar_options(audio_sample_rate),
        )
        await runner.start()
        await stopped.wait()
    finally:
        if runner is not None:
            await runner.aclose()
        await generator.aclose()
        await room.disconnect()
        log.info("avatar left room %s", room.name)

"""A client's binary messages: PCM chunks, Opus microphone packets and whole audio files, checked and decoded
into the PCM a session (or the conversation over it) takes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import numpy as np

from lipstream.audio.decode import decode_upload
from lipstream.errors import MediaError
from lipstream.media.opus import DECODE_RATE, StreamAudioDecoder
from lipstream.render.workers import WorkerPools
from lipstream.server.config import Limits
from lipstream.server.protocol import Flags, Kind, MediaMessage, ProtocolError, decode_media, unpack_packets

MIN_PCM_RATE, MAX_PCM_RATE = 8000, 48000

# takes decoded PCM (int16) at a rate: the microphone of a conversation, or speech to lip-sync
TakeAudio = Callable[[np.ndarray, int], Awaitable[None]]
# takes a whole decoded file (16 kHz) as one utterance
TakeUpload = Callable[[np.ndarray], Awaitable[None]]


class ClientAudio:
    """Decodes one connection's audio messages (its own Opus decoder) and hands the PCM on."""

    def __init__(self, limits: Limits, pools: WorkerPools, take: TakeAudio, upload: TakeUpload) -> None:
        """`limits`: message and upload sizes; `pools`: where an upload is decoded (blocking work); `take`
        gets streamed audio and `upload` a whole file's."""
        self.limits = limits
        self.pools = pools
        self._take = take
        self._upload = upload
        self._mic_decoder: StreamAudioDecoder | None = None  # made on the client's first mic_opus message

    async def on_binary(self, data: bytes) -> None:
        """One binary message from the client (ProtocolError or LipstreamError when it is not usable)."""
        if len(data) > self.limits.max_message_bytes + 20:
            raise ProtocolError(
                f"binary message of {len(data)} bytes is over the limit of {self.limits.max_message_bytes}",
                "too_large",
            )
        media = decode_media(data)
        if media.kind == Kind.PCM:
            await self._on_pcm(media)
        elif media.kind == Kind.MIC_OPUS:
            await self._on_mic_opus(media)
        elif media.kind == Kind.UPLOAD:
            await self._on_upload(media.payload)
        else:
            raise ProtocolError(
                f"binary kind {media.kind.name.lower()} is sent by the server, not the client"
            )

    async def _on_pcm(self, media: MediaMessage) -> None:
        _check_rate(media.aux, "pcm chunk declares sample rate")
        if len(media.payload) % 2:
            raise ProtocolError("pcm chunk has an odd byte count; it must be whole s16le samples")
        if media.payload:
            pcm = np.frombuffer(media.payload, dtype="<i2").astype(np.int16)
            await self._take(pcm, media.aux)

    async def _on_mic_opus(self, media: MediaMessage) -> None:
        # aux is the capture rate (a browser may encode 44.1 kHz); Opus decodes at 48 kHz whatever it was
        _check_rate(media.aux, "mic_opus message declares capture rate")
        packets = unpack_packets(media.payload)
        if self._mic_decoder is None:
            self._mic_decoder = StreamAudioDecoder()
        try:
            pcm = self._mic_decoder.decode(packets, restart=bool(media.flags & Flags.KEYFRAME))
        except MediaError as exc:
            raise ProtocolError(f"{exc}; send whole Opus packets, one encoder's stream", "bad_audio") from exc
        if len(pcm):
            await self._take(pcm, DECODE_RATE)

    async def _on_upload(self, payload: bytes) -> None:
        if len(payload) > self.limits.max_upload_bytes:
            raise ProtocolError(
                f"upload of {len(payload)} bytes is over the limit of {self.limits.max_upload_bytes}",
                "too_large",
            )
        if not payload:
            raise ProtocolError("upload is empty; send the bytes of an audio file", "bad_audio")
        # rate and length are checked before and while decoding (never a whole lying file decoded)
        pcm = await self.pools.run_speech(decode_upload, payload, self.limits.max_upload_seconds)
        await self._upload(pcm)


def _check_rate(rate: int, says: str) -> None:
    """A client audio message's aux rate, within what the server resamples; bad_audio otherwise."""
    if not MIN_PCM_RATE <= rate <= MAX_PCM_RATE:
        message = f"{says} {rate} Hz; put {MIN_PCM_RATE}-{MAX_PCM_RATE} in the aux field"
        raise ProtocolError(message, "bad_audio")

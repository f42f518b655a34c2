"""Opus for the live stream's audio (protocol 1.3): per-frame packets out, decoded PCM back in.

The session's audio is 16 kHz s16; libopus takes 16 kHz input as it is (no resampler, no resampler delay),
and every decoder outputs 48 kHz. One 40 ms video frame's audio is two 20 ms Opus packets, sent together in
the frame's audio message (lipstream/server/protocol.py frames them) so that every message still carries
the frame's own pts.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import av
import numpy as np

from lipstream.errors import MediaError

INPUT_RATE = 16000  # the session's audio rate: libopus accepts it directly
DECODE_RATE = 48000  # what Opus decoders output (WebCodecs, libopus in FFmpeg)
PACKET_SAMPLES = 320  # 20 ms at 16 kHz
# libopus's encoder look-ahead in 48 kHz samples (OpusHead pre-skip) for 16 kHz input: the decoded stream
# lags the input by this much; checked against the encoder's own OpusHead when it opens
PRE_SKIP = 312
DEFAULT_BITRATE = 24000


@dataclass(frozen=True)
class OpusSettings:
    """How the session's audio is encoded: bitrate in bit/s and the libopus application (pre-skip 312 for
    'voip' and 'audio'; 'lowdelay' has another and is refused when the encoder opens)."""

    bitrate: int = DEFAULT_BITRATE
    # 'audio' (libopus's "as close as possible to the input") rather than 'voip': on Piper speech at 24 kbit/s
    # the decoded waveform is 14 dB SNR / r 0.99 against 8 dB / r 0.97 for voip's SILK at the same rate, and
    # in Talk mode the server's echo canceller subtracts what it sent from the microphone: codec error is
    # echo it cannot cancel. 'lowdelay' overshoots the bitrate (30 kbit/s asked 24).
    application: str = "audio"


def _open_encoder(settings: OpusSettings) -> av.AudioCodecContext:
    ctx = av.CodecContext.create("libopus", "w")
    ctx.sample_rate = INPUT_RATE
    ctx.layout = "mono"
    ctx.format = "s16"
    ctx.bit_rate = settings.bitrate
    ctx.options = {"application": settings.application, "frame_duration": "20", "vbr": "on"}
    ctx.open()
    head = bytes(ctx.extradata or b"")
    if len(head) < 12 or head[:8] != b"OpusHead" or struct.unpack_from("<H", head, 10)[0] != PRE_SKIP:
        raise MediaError(f"libopus reports an unexpected OpusHead {head.hex()}; expected pre-skip {PRE_SKIP}")
    return ctx


class FrameAudioEncoder:
    """One session's Opus encoder: each frame's 640 samples in, that frame's two 20 ms packets out.

    The encoder restarts whenever the stream does not continue where the previous frame ended (an interrupt
    steps pts back or forward): look-ahead audio from before the cut is never sent after it. `encode` says
    when it restarted, so the receiver can restart its decoder and drop the new stream's pre-skip.
    """

    def __init__(self, settings: OpusSettings | None = None) -> None:
        """`settings`: bitrate and application (defaults: 24 kbit/s, 'audio')."""
        self.settings = settings or OpusSettings()
        self._ctx: av.AudioCodecContext | None = None
        self._next_pts: int | None = None

    def encode(self, pts: int, pcm: np.ndarray) -> tuple[list[bytes], bool]:
        """Packets for the frame at `pts` (16 kHz samples; `pcm` int16, a multiple of 20 ms) and whether
        the encoder restarted at this frame."""
        if len(pcm) % PACKET_SAMPLES:
            raise MediaError(f"{len(pcm)} samples is not a whole number of 20 ms Opus frames")
        restarted = self._ctx is None or pts != self._next_pts
        if restarted:
            self._ctx = _open_encoder(self.settings)
        self._next_pts = pts + len(pcm)
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(pcm, dtype=np.int16).reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate = INPUT_RATE
        frame.pts = pts
        packets = [bytes(p) for p in self._ctx.encode(frame)]
        # libopus codes every whole 20 ms it is given at once, so a frame always yields its own packets
        if len(packets) != len(pcm) // PACKET_SAMPLES:
            raise MediaError(f"libopus returned {len(packets)} packets for {len(pcm)} samples")
        return packets, restarted


class FrameAudioDecoder:
    """The receiving side: each frame's Opus packets in, that frame's 16 kHz int16 audio out, on the pts grid.

    The decoded 48 kHz stream lags the encoder's input by PRE_SKIP; after a restart those samples are
    dropped, so the output stays sample-aligned with the sender's input: the first frame after a restart
    yields PRE_SKIP/3 samples fewer, and the restart first pays back the previous run's last PRE_SKIP/3
    samples (still inside the sender's encoder when it restarted) as silence. The encoder saw 16 kHz audio,
    so nothing above 8 kHz is in the decoded signal and taking every third 48 kHz sample is a faithful
    decimation that adds no filter delay (which keeps the 16 kHz samples on the pts grid).
    """

    def __init__(self) -> None:
        """A decoder that has not started yet."""
        self._ctx: av.AudioCodecContext | None = None
        self._skip = 0

    def decode(self, packets: list[bytes], restart: bool) -> np.ndarray:
        """16 kHz int16 samples for these packets (`restart`: the sender's encoder restarted here)."""
        owed = np.zeros(0, np.int16)
        if restart or self._ctx is None:
            if self._ctx is not None:
                owed = np.zeros(PRE_SKIP // 3, np.int16)
            self._ctx = av.CodecContext.create("libopus", "r")
            self._ctx.sample_rate = DECODE_RATE
            self._ctx.layout = "mono"
            self._ctx.open()
            self._skip = PRE_SKIP
        chunks = [owed]
        for packet in packets:
            for frame in self._ctx.decode(av.Packet(packet)):
                chunks.append(_as_int16(frame.to_ndarray().reshape(-1)))
        pcm48 = np.concatenate(chunks[1:]) if len(chunks) > 1 else np.zeros(0, np.int16)
        drop = min(self._skip, len(pcm48))
        self._skip -= drop
        return np.concatenate([owed, pcm48[drop::3]]).astype(np.int16)


class StreamAudioDecoder:
    """A client's Opus stream (the microphone, protocol 1.4) in, 48 kHz int16 out, its pre-skip dropped.

    Unlike the session's own audio this stream was captured at any rate (a browser's 48 kHz, usually), so it
    is handed on at the decoder's 48 kHz for the receiver's resampler, never decimated here. A restart (a new
    encoder on the client: the microphone reopened, a new session) drops the new stream's pre-skip again.
    """

    def __init__(self, pre_skip: int = PRE_SKIP) -> None:
        """`pre_skip`: the sender's encoder look-ahead in 48 kHz samples (libopus: 312, browsers included)."""
        self.pre_skip = pre_skip
        self._ctx: av.AudioCodecContext | None = None
        self._skip = 0

    def decode(self, packets: list[bytes], restart: bool) -> np.ndarray:
        """48 kHz int16 samples for these packets; MediaError for a packet libopus cannot decode."""
        if restart or self._ctx is None:
            self._ctx = av.CodecContext.create("libopus", "r")
            self._ctx.sample_rate = DECODE_RATE
            self._ctx.layout = "mono"
            self._ctx.open()
            self._skip = self.pre_skip
        chunks = []
        try:
            for packet in packets:
                frames = self._ctx.decode(av.Packet(packet))
                chunks.extend(_as_int16(f.to_ndarray().reshape(-1)) for f in frames)
        except av.error.FFmpegError as exc:
            self._ctx = None  # a broken stream starts over with the next packet
            raise MediaError(f"an Opus packet could not be decoded ({exc})") from exc
        pcm = np.concatenate(chunks) if chunks else np.zeros(0, np.int16)
        drop = min(self._skip, len(pcm))
        self._skip -= drop
        return pcm[drop:]


def _as_int16(samples: np.ndarray) -> np.ndarray:
    """Decoder output as int16 (FFmpeg builds differ: s16 or float)."""
    if samples.dtype == np.int16:
        return samples
    return np.clip(np.round(samples.astype(np.float64) * 32767.0), -32768, 32767).astype(np.int16)

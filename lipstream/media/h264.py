"""Live H.264 for the browser: baseline, zero latency, one Annex-B access unit per frame, IDR on request."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import av
import cv2
import numpy as np
from av.video.frame import PictureType

from lipstream.audio.timeline import FPS, SAMPLE_RATE
from lipstream.errors import MediaError
from lipstream.media.yuv import check_even_size, check_rgb, is_i420, rgb_to_yuv420p, tag_bt601, to_video_frame

NAL_IDR = 5
NAL_SPS = 7
NAL_PPS = 8


@dataclass(frozen=True)
class EncodedUnit:
    """One access unit in Annex-B (start codes), its pts in 16 kHz audio samples, and whether it is an IDR."""

    data: bytes
    keyframe: bool
    pts: int


def split_nal_units(data: bytes) -> list[bytes]:
    """Split an Annex-B byte stream into NAL units (start codes removed)."""
    units: list[bytes] = []
    starts: list[int] = []
    i = data.find(b"\x00\x00\x01")
    while i >= 0:
        starts.append(i + 3)
        i = data.find(b"\x00\x00\x01", i + 3)
    for n, start in enumerate(starts):
        end = starts[n + 1] - 3 if n + 1 < len(starts) else len(data)
        units.append(data[start:end].rstrip(b"\x00") if n + 1 < len(starts) else data[start:end])
    return units


def nal_types(data: bytes) -> list[int]:
    """NAL unit types (5 = IDR slice, 7 = SPS, 8 = PPS, 1 = non-IDR slice) of an Annex-B access unit."""
    return [unit[0] & 0x1F for unit in split_nal_units(data) if unit]


def codec_string_from_sps(sps: bytes) -> str:
    """WebCodecs codec string 'avc1.PPCCLL' from an SPS NAL unit (profile, constraint flags, level)."""
    if len(sps) < 4 or sps[0] & 0x1F != NAL_SPS:
        raise MediaError("not an H.264 SPS NAL unit; cannot derive a codec string")
    return f"avc1.{sps[1]:02X}{sps[2]:02X}{sps[3]:02X}"


def _find_sps(access_unit: bytes) -> bytes | None:
    """The SPS NAL unit inside an access unit, if any."""
    return next((u for u in split_nal_units(access_unit) if u and u[0] & 0x1F == NAL_SPS), None)


class H264StreamEncoder:
    """Encode RGB frames to Constrained Baseline H.264, one access unit per frame, for WebCodecs players.

    The first frame and every frame with force_idr=True are IDRs carrying SPS/PPS, so a player can join
    there; otherwise an IDR comes every gop_seconds. With output_size the stream is scaled (INTER_AREA)
    before encoding, e.g. a half-size stream for slow links.
    """

    def __init__(
        self,
        width: int,
        height: int,
        fps: int = FPS,
        bitrate: int = 2_000_000,
        output_size: tuple[int, int] | None = None,
        preset: str = "veryfast",
        gop_seconds: float = 4.0,
        threads: int = 2,
    ) -> None:
        """Open libx264 for input frames of width×height; output_size=(w, h) scales the stream."""
        if width <= 0 or height <= 0:
            raise MediaError(f"frame size must be positive, got {width}x{height}")
        self.width, self.height, self.fps = width, height, fps
        self.out_width, self.out_height = output_size or (width, height)
        check_even_size(self.out_width, self.out_height)
        if fps <= 0 or bitrate <= 0:
            raise MediaError(f"fps and bitrate must be positive (got {fps}, {bitrate})")
        self.bitrate, self.preset, self.threads = bitrate, preset, threads
        self.gop = max(1, round(gop_seconds * fps))
        self._context = self._open_context()
        self._frames = 0
        self._codec_string: str | None = None

    def _open_context(self) -> av.VideoCodecContext:
        """A fresh libx264 context with the stream's settings."""
        ctx = av.CodecContext.create("libx264", "w")
        ctx.width, ctx.height, ctx.pix_fmt = self.out_width, self.out_height, "yuv420p"
        ctx.time_base = Fraction(1, self.fps)
        ctx.framerate = Fraction(self.fps, 1)
        ctx.bit_rate = self.bitrate
        ctx.gop_size = self.gop
        ctx.max_b_frames = 0
        ctx.thread_count = self.threads
        tag_bt601(ctx)
        ctx.options = {
            "profile": "baseline",
            "tune": "zerolatency",
            "preset": self.preset,
            "forced-idr": "1",
            # A one-second VBV keeps the rate steady enough for a WebSocket without starving IDRs.
            "maxrate": str(self.bitrate),
            "bufsize": str(self.bitrate),
        }
        try:
            ctx.open()
        except av.error.FFmpegError as exc:
            raise MediaError(f"cannot open the H.264 encoder ({exc}); check size and bitrate") from exc
        return ctx

    @property
    def frames_encoded(self) -> int:
        """Frames encoded so far."""
        return self._frames

    @property
    def codec_string(self) -> str:
        """WebCodecs codec string from the SPS (e.g. avc1.42C01F); probed once if nothing is encoded yet."""
        if self._codec_string is None:
            probe = self._open_context()
            packets = probe.encode(rgb_to_yuv420p(np.zeros((self.out_height, self.out_width, 3), np.uint8)))
            sps = _find_sps(b"".join(bytes(p) for p in packets))
            if sps is None:
                raise MediaError("the H.264 encoder emitted no SPS; cannot derive a codec string")
            self._codec_string = codec_string_from_sps(sps)
        return self._codec_string

    def encode(self, rgb: np.ndarray, force_idr: bool = False, pts: int | None = None) -> EncodedUnit:
        """Encode one frame (RGB input size, or I420 at the stream size); pts in 16 kHz samples."""
        if is_i420(rgb, self.out_width, self.out_height):
            frame = to_video_frame(rgb, self.out_width, self.out_height)  # already at the stream size
        else:
            image = check_rgb(rgb, self.width, self.height)
            if (self.out_width, self.out_height) != (self.width, self.height):
                image = cv2.resize(image, (self.out_width, self.out_height), interpolation=cv2.INTER_AREA)
            frame = rgb_to_yuv420p(image)
        frame.pts = self._frames
        if force_idr or self._frames == 0:
            frame.pict_type = PictureType.I
        packets = self._context.encode(frame)
        if len(packets) != 1:  # zerolatency: no lookahead, no B-frames; anything else breaks the live clock
            raise MediaError(f"H.264 encoder returned {len(packets)} packets for one frame; expected one")
        data = bytes(packets[0])
        keyframe = NAL_IDR in nal_types(data)
        if keyframe and self._codec_string is None:
            sps = _find_sps(data)
            self._codec_string = codec_string_from_sps(sps) if sps else None
        unit_pts = self._frames * (SAMPLE_RATE // self.fps) if pts is None else pts
        self._frames += 1
        return EncodedUnit(data=data, keyframe=keyframe, pts=unit_pts)

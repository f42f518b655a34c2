"""Streams out: what a produced frame becomes for its consumer, behind one small interface.

The producer hands each frame's base-frame index and mouth patch (None when the mouth rests) to the
session's sink on a worker thread; the sink returns what the consumer gets and puts it on the AvatarFrame.
A consumer that wants raw pictures (the Pipecat adapter, a recorder) takes `RawFrames` (RGB), one that
hands them to WebRTC (the LiveKit generator) `I420Frames`, and nothing is encoded; the WebSocket server
takes one of the H.264 sinks.
"""

from __future__ import annotations

from typing import Any, Protocol

import cv2
import numpy as np

from lipstream.audio.timeline import FPS
from lipstream.avatar.bundle import CROP_SIZE
from lipstream.render.compositor import Compositor
from lipstream.render.frames import AvatarFrame
from lipstream.render.idle_gops import IdleReplay, SharedIdleGops
from lipstream.render.idle_loop_fill import cache_file, own_pictures
from lipstream.render.idle_loop_fill import fill as fill_idle_loop
from lipstream.render.timing import StageTimer


class FrameSink(Protocol):
    """Turns a produced frame into what its consumer takes."""

    codec_string: str  # WebCodecs codec string of an encoded stream; "" for raw frames

    def bind(self, compositor: Compositor, timer: StageTimer) -> None:
        """The session's compositor (base frame + patch -> picture at the stream size) and stage timer."""

    def open(self) -> None:
        """Make the encoder, if any (at session start, after warm-up)."""

    def warm_up(self, idle_loop: np.ndarray) -> None:
        """Build what depends only on the avatar (worker thread, before the first frame)."""

    def make(
        self, tick: int, base_id: int, patch: np.ndarray | None, generation: int, lids: float = 0.0
    ) -> Any:
        """Worker thread: the consumer's form of the frame at display `tick` (`generation` changes after an
        interrupt; `lids`: how far a blink decided while speaking lowers the lids, drawn by sinks that
        composite)."""

    def fill(self, item: AvatarFrame, made: Any) -> None:
        """Put what `make` returned on the frame handed to the consumer."""

    def request_keyframe(self) -> None:
        """The next encoded picture must decode on its own (a client lost its state, or an interrupt)."""

    def close(self) -> None:
        """Free the encoder."""


def warm_geometry(compositor: Compositor, idle_loop: np.ndarray) -> None:
    """Blend geometry of every frame the idle loop shows, made before the first frame."""
    for index in np.unique(idle_loop):  # a clip's loop shows each frame twice, a photo's many times
        compositor.geometry(int(index))


class _Bound:
    """The session's compositor and timer, given by `bind` before anything else is called."""

    compositor: Compositor
    timer: StageTimer

    def bind(self, compositor: Compositor, timer: StageTimer) -> None:
        """Keep the session's compositor and stage timer."""
        self.compositor = compositor
        self.timer = timer


class RawFrames(_Bound):
    """Composited RGB pictures at the stream size; no encoding."""

    codec_string = ""

    def open(self) -> None:
        """Nothing to open."""

    def warm_up(self, idle_loop: np.ndarray) -> None:
        """The blend geometry of the frames the stream starts on."""
        warm_geometry(self.compositor, idle_loop)

    def make(
        self, tick: int, base_id: int, patch: np.ndarray | None, generation: int, lids: float = 0.0
    ) -> np.ndarray:
        """The composited picture."""
        with self.timer.stage("compositor"):
            return self.compositor.compose(base_id, patch, lids=lids)

    def fill(self, item: AvatarFrame, made: np.ndarray) -> None:
        """The picture goes on `item.image`."""
        item.image = made

    def request_keyframe(self) -> None:
        """Every raw picture stands alone."""

    def close(self) -> None:
        """Nothing to free."""


class I420Frames(RawFrames):
    """Composited I420 pictures at the stream size; no encoding. For consumers that hand frames to WebRTC
    (LiveKit's VideoSource): only the mouth rectangle is colour-converted, on the render worker, instead of
    the whole RGB picture on the consumer's event loop."""

    def warm_up(self, idle_loop: np.ndarray) -> None:
        """The avatar's I420 pictures at this size, and the blend geometry of the first frames. A scaled
        stream builds every picture its loop shows now: each costs a full-size decode, a resize and a
        conversion the first time (~50 ms at 540x960 of a 1080x1920 avatar on a busy 2-core machine, more
        than a frame's 40 ms), which would otherwise slow the stream's whole first pass through the loop."""
        base = self.compositor.base
        base.decode_ahead()
        scaled = (base.width, base.height) != tuple(base.bundle.size)
        for index in np.unique(idle_loop) if scaled else idle_loop[:1]:
            base.i420(int(index))
        warm_geometry(self.compositor, idle_loop)

    def make(
        self, tick: int, base_id: int, patch: np.ndarray | None, generation: int, lids: float = 0.0
    ) -> np.ndarray:
        """The composited picture, I420."""
        with self.timer.stage("compositor"):
            return self.compositor.compose_i420(base_id, patch, lids=lids)

    def fill(self, item: AvatarFrame, made: np.ndarray) -> None:
        """The picture goes on `item.i420`."""
        item.i420 = made


class _H264Sink(_Bound):
    """What both H.264 sinks share: the encoder and when a picture must be an IDR."""

    size: tuple[int, int]

    def __init__(self, bitrate: int, threads: int | None) -> None:
        self.bitrate = bitrate
        self.threads = threads
        self.encoder: Any = None
        self._force_idr = True
        self._encoded_generation = 0

    @property
    def codec_string(self) -> str:
        """WebCodecs codec string (empty before `open`)."""
        return self.encoder.codec_string if self.encoder is not None else ""

    def open(self) -> None:
        """Make the encoder."""
        from lipstream.media.h264 import H264StreamEncoder

        extra = {} if self.threads is None else {"threads": self.threads}
        self.encoder = H264StreamEncoder(*self.size, fps=FPS, bitrate=self.bitrate, **extra)

    def request_keyframe(self) -> None:
        """The next picture is an IDR."""
        self._force_idr = True

    def _idr_due(self, generation: int) -> bool:
        # frames made before an interrupt are never sent, so the first one after it must decode on its own
        return self._force_idr or generation != self._encoded_generation

    def _must_be_idr(self, generation: int, extra: bool = False) -> bool:
        force = self._idr_due(generation) or extra
        self._encoded_generation = generation
        self._force_idr = False
        return force

    def fill(self, item: AvatarFrame, made: Any) -> None:
        """The access unit goes on `item.access_unit` (empty when nothing was encoded)."""
        if made is None:
            item.access_unit = b""
        else:
            item.access_unit = made.data
            item.keyframe = bool(made.keyframe)

    def close(self) -> None:
        """Drop the encoder."""
        self.encoder = None


class WholeFrameH264(_H264Sink):
    """Whole frames composited in I420 at the stream size and encoded (the server's full stream, recorders,
    `lipstream client`). Idle frames are encoded once per loop position and then replayed (idle_gops.py)."""

    def __init__(
        self, bitrate: int, idle_gops: SharedIdleGops | None = None, replay_idle: bool = True
    ) -> None:
        """Encode whole pictures at up to `bitrate` bits/s; `idle_gops`: the encoded idle loops a server's
        sessions share (by default this stream's own); `replay_idle` False encodes every frame."""
        super().__init__(bitrate, threads=None)
        self._shared_idle = idle_gops or SharedIdleGops(max_loops=1)
        self.replay_idle = replay_idle
        self.replay: IdleReplay | None = None
        self._replaying = False  # the last frame came from the cache: the next live one is an IDR

    def bind(self, compositor: Compositor, timer: StageTimer) -> None:
        """Keep the compositor; the stream has its size, and its avatar's encoded idle loop at that size."""
        super().bind(compositor, timer)
        self.size = (compositor.width, compositor.height)
        bundle = compositor.base.bundle
        self.replay = IdleReplay(self._shared_idle.get(bundle, self.size, self.bitrate))

    def warm_up(self, idle_loop: np.ndarray) -> None:
        """The avatar's I420 pictures at this size, the blend geometry of the first frames, and the encoded
        idle loop (read from the avatar's cache, or encoded there in the background)."""
        self.compositor.base.decode_ahead()
        self.compositor.base.i420(int(idle_loop[0]))  # the first frame the loop shows
        warm_geometry(self.compositor, idle_loop)
        if self.replay_idle and self.replay is not None:
            bundle, size, gops = self.compositor.base.bundle, self.size, self.replay.gops
            path = cache_file(bundle.path, size, self.bitrate, gops.gop)
            fill_idle_loop(gops, path, lambda: own_pictures(bundle, size), size, self.bitrate)

    def make(
        self, tick: int, base_id: int, patch: np.ndarray | None, generation: int, lids: float = 0.0
    ) -> Any:
        """The frame's access unit: replayed for an idle frame whose GOP is cached, else encoded."""
        assert self.replay is not None, "bind() comes first"
        position = tick % self.replay.gops.loop_length
        idle = self.replay_idle and patch is None and lids == 0.0
        if idle:
            # an IDR asked for (stream start, keyframe request, interrupt) is a cached GOP's first unit
            unit = self.replay.next(position, generation, key=self._idr_due(generation))
            if unit is not None:
                self._replaying = True
                self._force_idr = False
                self._encoded_generation = generation
                return unit
        self.replay.stop()
        start_gop = idle and self.replay.wants_idr(position)
        force = self._must_be_idr(generation, extra=self._replaying or start_gop)
        self._replaying = False
        with self.timer.stage("compositor"):
            image = self.compositor.compose_i420(base_id, patch, lids=lids)
        with self.timer.stage("encode"):
            unit = self.encoder.encode(image, force_idr=force)
        self.replay.encoded(position, generation, unit, idle)
        return unit


class MouthPatchH264(_H264Sink):
    """Only the crop-space mouth rectangle, encoded; the client composites it onto the base loop it holds.

    Nothing is encoded or sent while the mouth rests (the base loop alone is the right picture)."""

    def __init__(self, rect: tuple[int, int, int, int], bitrate: int) -> None:
        """Encode the `rect` (x0, y0, x1, y1 in crop space) of each patch at up to `bitrate` bits/s."""
        x0, y0, x1, y1 = rect
        super().__init__(bitrate, threads=1)
        self.size = (x1 - x0, y1 - y0)
        self.rect = rect
        self._resting = True  # the previous frame had no patch: the next patch is an IDR

    def warm_up(self, idle_loop: np.ndarray) -> None:
        """Nothing is composited on the server: no base pictures, no blend geometry."""

    def make(
        self, tick: int, base_id: int, patch: np.ndarray | None, generation: int, lids: float = 0.0
    ) -> Any:
        """The patch's access unit, or None while the mouth rests (the client draws `lids` itself)."""
        if patch is None:
            self._resting = True
            return None
        with self.timer.stage("encode"):
            if patch.shape[0] != CROP_SIZE:
                patch = cv2.resize(patch, (CROP_SIZE, CROP_SIZE), interpolation=cv2.INTER_LINEAR)
            x0, y0, x1, y1 = self.rect
            # the first patch after rest or an interrupt is an IDR: every utterance decodes on its own
            force = self._must_be_idr(generation, extra=self._resting)
            self._resting = False
            return self.encoder.encode(np.ascontiguousarray(patch[y0:y1, x0:x1]), force_idr=force)

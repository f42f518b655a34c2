"""H.264 MP4 files of still-camera footage: written frame by frame on a thread, read back by frame position.

The files have a fixed GOP (a key frame every `gop` frames, no B-frames), so frame k lies in GOP k // gop and
any frame is reached by decoding at most one GOP. A reader decodes whole GOPs and keeps the most recently
used ones within a byte budget; sequential access (forward or backward) decodes each GOP once.
"""

from __future__ import annotations

import queue
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, replace
from fractions import Fraction
from pathlib import Path
from typing import Self

import av
import cv2
import numpy as np

from lipstream.errors import MediaError
from lipstream.media.yuv import cut_i420, tag_bt601
from lipstream.threads import lower_thread_priority

PIXEL_FORMATS = ("rgb24", "yuv420p")  # what a reader returns: H×W×3 RGB, or an I420 picture [(H*3/2), W]


@dataclass(frozen=True)
class VideoEncoding:
    """How footage is compressed: x264 CRF 18 is visually lossless on a face (42-43 dB PSNR measured)."""

    crf: int = 18
    preset: str = "veryfast"
    # no CABAC and no deblocking: decodes twice as fast (9 vs 19 ms a 1080×1920 frame measured here) for
    # ~14 % more bytes at the same PSNR; frames are decoded on every server start, encoded once
    tune: str = "fastdecode"
    gop: int = 25  # one key frame a second: a random frame costs at most 25 decodes
    # diamond motion search (the preset's is hexagon): a 1080×1920 frame of a small moving face took 11.2
    # instead of 15.2 ms of CPU for the same bytes and PSNR (issue 37: encoding was most of a prepare)
    motion_search: str = "dia"
    # one sub-pixel refinement pass (the preset's is 2): 10-14 % faster prepares of short clips for 3-4 %
    # more bytes and ~0.7 dB less PSNR against the source, at 50 dB (issue 37)
    subpixel_refine: int = 1
    still_crf: int = 8  # a photo is one intra frame: near-lossless costs a few hundred kB, once

    def for_frames(self, frame_count: int) -> VideoEncoding:
        """The settings for a clip of `frame_count` frames (a photo gets still_crf)."""
        return replace(self, crf=self.still_crf) if frame_count == 1 else self


def x264_options(encoding: VideoEncoding) -> dict[str, str]:
    """libx264's options for closed GOPs of `encoding.gop` frames: no B-frames, no scene-cut key frames."""
    enc = encoding
    tune = {"tune": enc.tune} if enc.tune else {}
    gop = str(enc.gop)
    return {"crf": str(enc.crf), "preset": enc.preset, "bf": "0", "g": gop, "keyint_min": gop,
            "sc_threshold": "0", "motion-est": enc.motion_search, "subq": str(enc.subpixel_refine),
            **tune}  # fmt: skip


def even_size(width: int, height: int) -> tuple[int, int]:
    """The coded size of a width×height picture: yuv420p needs even sides (the last column/row repeats)."""
    return width + width % 2, height + height % 2


def codec_string(extradata: bytes | None) -> str:
    """avc1.PPCCLL (RFC 6381) from an avcC record; High 4.0 when there is none."""
    extra = bytes(extradata or b"")
    if len(extra) >= 4 and extra[0] == 1:  # avcC: version, profile, compatibility, level
        return f"avc1.{extra[1:4].hex().upper()}"
    return "avc1.640028"


def file_codec_string(path: Path) -> str:
    """The codec string of an MP4's first video stream."""
    with av.open(str(path)) as container:
        return codec_string(container.streams.video[0].codec_context.extradata)


def coded_i420(rgb: np.ndarray, coded_w: int, coded_h: int) -> np.ndarray:
    """RGB as the I420 picture the writer encodes: padded to the coded (even) size by repeating the edge."""
    height, width = rgb.shape[:2]
    if (coded_w, coded_h) != (width, height):
        rgb = cv2.copyMakeBorder(rgb, 0, coded_h - height, 0, coded_w - width, cv2.BORDER_REPLICATE)
    return cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420)


class FileWriter:
    """A writer used as a context manager: the file is finished when the block ends, aborted when it raised
    (Ctrl-C included); subclasses give `close` and `abort`."""

    def close(self) -> None:
        """Finish the file."""
        raise NotImplementedError

    def abort(self) -> None:
        """Stop after a failure (the partial file is the caller's to remove)."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        """Finish the file, or abort it when the block raised."""
        if exc_type is None:
            self.close()
        else:
            self.abort()


class Mp4FrameWriter(FileWriter):
    """Append RGB frames to an H.264 MP4 (fixed GOP, no B-frames, BT.601, moov first) on a writer thread,
    so the encoder overlaps whatever produces the frames and at most `queue_frames` wait in memory."""

    def __init__(
        self,
        path: Path,
        width: int,
        height: int,
        fps: int,
        encoding: VideoEncoding | None = None,
        queue_frames: int = 4,
    ) -> None:
        self.path = Path(path)
        self.width, self.height = width, height
        self.encoding = encoding or VideoEncoding()
        self.frames = 0
        self.codec = ""
        self.coded_size = even_size(width, height)
        self._error: BaseException | None = None
        self._queue: queue.Queue[np.ndarray | None] = queue.Queue(maxsize=queue_frames)
        self._container = av.open(str(self.path), mode="w", format="mp4", options={"movflags": "+faststart"})
        enc = self.encoding
        self._stream = self._container.add_stream(
            "libx264",
            rate=fps,
            options=x264_options(enc),
        )
        self._stream.width, self._stream.height = self.coded_size
        self._stream.pix_fmt = "yuv420p"
        self._stream.codec_context.time_base = Fraction(1, fps)
        tag_bt601(self._stream.codec_context)
        self._thread = threading.Thread(target=self._drain, name=f"{self.path.name} writer", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        try:
            while (picture := self._queue.get()) is not None:
                if self._error is None:
                    self._encode(picture)
            if self._error is None:
                self._container.mux(self._stream.encode(None))
                self.codec = codec_string(self._stream.codec_context.extradata)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller in close()
            self._error = exc
            while self._queue.get() is not None:  # keep the producer from blocking forever
                pass
        finally:
            try:
                self._container.close()
            except Exception as exc:  # noqa: BLE001 - a failed trailer write is the caller's error too
                self._error = self._error or exc

    def _encode(self, picture: np.ndarray) -> None:
        if picture.ndim == 3:  # RGB: converted here, on the writer's thread
            picture = coded_i420(picture, *self.coded_size)
        frame = av.VideoFrame.from_ndarray(picture, format="yuv420p")
        frame.pts = self.frames
        self._container.mux(self._stream.encode(frame))
        self.frames += 1

    def append(self, rgb: np.ndarray) -> None:
        """Queue the next frame, H×W×3 uint8 RGB (blocks while the queue is full)."""
        rgb = np.asarray(rgb)
        if rgb.shape != (self.height, self.width, 3) or rgb.dtype != np.uint8:
            raise MediaError(
                f"frame of shape {rgb.shape} does not fit {self.path.name} ({self.height}, {self.width}, 3)"
            )
        if self._error is not None:
            raise MediaError(f"cannot write {self.path}: {self._error}") from self._error
        self._queue.put(np.ascontiguousarray(rgb))

    def append_i420(self, picture: np.ndarray) -> None:
        """Queue the next frame as an I420 picture at the coded size (as `coded_i420` makes it)."""
        coded_w, coded_h = self.coded_size
        if picture.shape != (coded_h * 3 // 2, coded_w) or picture.dtype != np.uint8:
            raise MediaError(
                f"I420 picture of shape {picture.shape} does not fit {self.path.name} ({coded_w}x{coded_h})"
            )
        if self._error is not None:
            raise MediaError(f"cannot write {self.path}: {self._error}") from self._error
        self._queue.put(np.ascontiguousarray(picture))

    def close(self) -> None:
        """Encode what is queued and finish the file; raise if anything failed."""
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise MediaError(f"cannot write {self.path}: {self._error}") from self._error

    def abort(self) -> None:
        """Stop after a failure elsewhere (the partial file is the caller's to remove)."""
        self._error = self._error or RuntimeError("aborted")
        self._queue.put(None)
        self._thread.join()


class GopReader:
    """Frames of an MP4 written by Mp4FrameWriter, by position (0-based), as read-only arrays.

    Whole GOPs are decoded and kept as I420 (half the bytes of RGB), the most recently used ones within
    `budget_bytes` (at least one, three with decode-ahead); `pixel_format` says what an index returns. With
    `prefetch`, the GOPs on either side of the one just read are decoded ahead on a low-priority thread, so
    a reader moving through the file in either direction rarely waits for a decode. Safe to share between
    threads."""

    def __init__(
        self,
        path: Path,
        frame_count: int,
        size: tuple[int, int],
        gop: int,
        pixel_format: str = "rgb24",
        budget_bytes: int = 0,
        prefetch: bool = False,
    ) -> None:
        if pixel_format not in PIXEL_FORMATS:
            raise ValueError(f"pixel_format must be one of {PIXEL_FORMATS}, got {pixel_format!r}")
        self.path = Path(path)
        self.frame_count = frame_count
        self.width, self.height = size
        if pixel_format == "yuv420p" and (self.width % 2 or self.height % 2):
            raise ValueError(f"an I420 picture needs even sides, got {self.width}x{self.height}")
        self.gop = max(1, gop)
        self.pixel_format = pixel_format
        self.budget_bytes = budget_bytes
        self.decoded_gops = 0  # how many GOP decodes ran (a figure for tests and benchmarks)
        self._gops: OrderedDict[int, list[np.ndarray]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._pending: dict[int, threading.Event] = {}
        self._prefetch: queue.Queue[int] | None = None
        self._wants_prefetch = prefetch  # the thread starts with the first decode-ahead request

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the whole sequence, as if it were one array."""
        if self.pixel_format == "rgb24":
            return (self.frame_count, self.height, self.width, 3)
        return (self.frame_count, self.height * 3 // 2, self.width)

    @property
    def dtype(self) -> np.dtype:
        """Element type of every frame (uint8)."""
        return np.dtype(np.uint8)

    @property
    def cached_bytes(self) -> int:
        """Bytes of decoded pictures held now."""
        return self._bytes

    def __len__(self) -> int:
        return self.frame_count

    def __getitem__(self, position: int) -> np.ndarray:
        i420 = self.i420(position)
        if self.pixel_format == "yuv420p":
            return i420
        # cv2's inverse of the writer's conversion (swscale might assume BT.709 for HD sizes)
        rgb = cv2.cvtColor(i420, cv2.COLOR_YUV2RGB_I420)
        if rgb.shape[:2] != (self.height, self.width):
            rgb = np.ascontiguousarray(rgb[: self.height, : self.width])
        rgb.flags.writeable = False
        return rgb

    def i420(self, position: int) -> np.ndarray:
        """Frame `position` as I420 at the coded size (read-only; the logical size when that is even)."""
        position = int(position)
        if position < 0:
            position += self.frame_count
        if not 0 <= position < self.frame_count:
            raise IndexError(f"frame {position} is outside {self.path.name} (0..{self.frame_count - 1})")
        g, offset = divmod(position, self.gop)
        frames = self._gop(g)
        for neighbour in (g + 1, g - 1):
            self.decode_ahead(neighbour)
        return frames[offset]

    def decode_ahead(self, g: int) -> None:
        """Have GOP `g` decoded on the decode-ahead thread (no-op without one, or when it is there)."""
        if not self._wants_prefetch or not 0 <= g * self.gop < self.frame_count or self._has(g):
            return
        if self._prefetch is None:
            with self._lock:
                if self._prefetch is None:
                    self._prefetch = queue.Queue()
                    # the thread holds only a weak reference: a reader nobody uses any more is freed with it
                    threading.Thread(
                        target=_prefetch_loop, args=(weakref.ref(self), self._prefetch),
                        name=f"{self.path.name} decode-ahead", daemon=True,
                    ).start()  # fmt: skip
        self._prefetch.put(g)

    def release(self) -> None:
        """Drop every decoded picture (they are decoded again when asked for)."""
        with self._lock:
            self._gops.clear()
            self._bytes = 0

    def _has(self, g: int) -> bool:
        with self._lock:
            return g in self._gops or g in self._pending

    def _gop(self, g: int) -> list[np.ndarray]:
        while True:
            with self._lock:
                frames = self._gops.get(g)
                if frames is not None:
                    self._gops.move_to_end(g)
                    return frames
                event = self._pending.get(g)
                mine = event is None
                if mine:
                    event = self._pending[g] = threading.Event()
            assert event is not None
            if not mine:  # another thread is decoding it: wait, then take it from the cache
                event.wait()
                continue
            try:
                frames = self._decode(g)
                with self._lock:
                    self._store(g, frames)
                return frames
            finally:
                with self._lock:
                    self._pending.pop(g, None)
                event.set()

    def _store(self, g: int, frames: list[np.ndarray]) -> None:
        self._gops[g] = frames
        self._bytes += sum(f.nbytes for f in frames)
        # with decode-ahead, the GOPs either side of the one in use are kept too (else they evict each other)
        keep = 3 if self._wants_prefetch else 1
        while self._bytes > self.budget_bytes and len(self._gops) > keep:
            _, dropped = self._gops.popitem(last=False)
            self._bytes -= sum(f.nbytes for f in dropped)

    def _decode(self, g: int) -> list[np.ndarray]:
        """Frames g*gop .. (g+1)*gop - 1 (fewer at the end of the file) as I420."""
        first = g * self.gop
        wanted = min(self.gop, self.frame_count - first)
        out: list[np.ndarray] = []
        try:
            with av.open(str(self.path)) as container:
                stream = container.streams.video[0]
                stream.thread_type = "AUTO"
                fps = float(stream.average_rate or stream.base_rate or 25)
                start = stream.start_time or 0
                if first:
                    container.seek(
                        start + int(round(first / fps / stream.time_base)), stream=stream, backward=True
                    )
                for frame in container.decode(stream):
                    position = int(round(float((frame.pts - start) * stream.time_base) * fps))
                    if position < first:
                        continue
                    out.append(self._picture(frame))
                    if len(out) == wanted:
                        break
        except av.FFmpegError as exc:
            raise MediaError(f"cannot decode {self.path} ({exc}); the file is damaged, re-create it") from exc
        if len(out) != wanted:
            raise MediaError(
                f"{self.path} holds fewer frames than expected ({first + len(out)} < {first + wanted})"
            )
        self.decoded_gops += 1
        return out

    def _picture(self, frame: av.VideoFrame) -> np.ndarray:
        width, height = even_size(self.width, self.height)
        picture = crop_i420(frame.to_ndarray(format="yuv420p"), frame.width, frame.height, width, height)
        picture.flags.writeable = False
        return picture


def _prefetch_loop(reader_ref: weakref.ref, work: queue.Queue[int]) -> None:
    """Decode the GOPs asked for ahead of time, until the reader is gone."""
    lower_thread_priority(5)
    while True:
        try:
            g = work.get(timeout=2.0)
        except queue.Empty:
            if reader_ref() is None:
                return
            continue
        reader = reader_ref()
        if reader is None:
            return
        if not reader._has(g):
            try:
                reader._gop(g)
            except Exception:  # noqa: BLE001 - a reader that needs this GOP raises the error itself
                pass
        del reader


def crop_i420(i420: np.ndarray, coded_w: int, coded_h: int, width: int, height: int) -> np.ndarray:
    """An I420 picture of coded_w×coded_h cut to width×height (both even); a copy only when it shrinks."""
    if (coded_w, coded_h) == (width, height):
        return i420
    return cut_i420(i420, coded_w, coded_h, (0, 0, width, height))

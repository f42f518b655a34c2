"""The avatar's base frames at the output size, as RGB and as I420, cached once per avatar and size."""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import weakref
from pathlib import Path

import cv2
import numpy as np

from lipstream.avatar.bundle import AvatarBundle
from lipstream.avatar.bundle_video import loop_positions
from lipstream.media.gop_video import GopReader
from lipstream.media.yuv import cut_i420

log = logging.getLogger(__name__)

CACHE_DIR = "cache"
# the stream widths a client may ask for, as fractions of the avatar's width: only downscaling, and few
# sizes, so what a client asks for can never grow memory or disk beyond these
STREAM_SCALES = (1.0, 3 / 4, 2 / 3, 1 / 2, 1 / 3, 1 / 4)
MIN_STREAM_WIDTH = 64


def stream_sizes(avatar_size: tuple[int, int]) -> list[tuple[int, int]]:
    """The output sizes a stream of this avatar may have (even, aspect kept), largest first."""
    width, height = avatar_size
    sizes: list[tuple[int, int]] = []
    for scale in STREAM_SCALES:
        w = int(round(width * scale / 2)) * 2
        h = int(round(height * w / width / 2)) * 2
        if (w >= MIN_STREAM_WIDTH or not sizes) and (w, h) not in sizes:
            sizes.append((w, h))
    return sizes


def stream_size(avatar_size: tuple[int, int], requested_width: int | None) -> tuple[int, int]:
    """The allowed output size for a requested width: the largest allowed size not wider than it (the
    smallest allowed one when it is narrower than all of them); None or wider: the avatar's own size."""
    sizes = stream_sizes(avatar_size)
    if requested_width is None:
        return sizes[0]
    fitting = [size for size in sizes if size[0] <= requested_width]
    return fitting[0] if fitting else sizes[-1]


def i420_shape(width: int, height: int) -> tuple[int, int]:
    """Array shape of one I420 (yuv420p) picture as cv2 and PyAV lay it out."""
    return height * 3 // 2, width


# decoded pictures of a format-2 avatar kept per size: a 6 s idle loop of 1080×1920 (466 MB) fits, and the
# 8 s loop of an upgraded format-1 sample (620 MB)
DEFAULT_FRAME_CACHE_MB = 640


class BaseFrameStore:
    """Base frames for the hot path: RGB (scaled if asked) and I420, so no full-frame colour
    conversion runs per output frame.

    At the avatar's own size, a format-2 bundle's pictures are decoded from its loop.mp4 on demand, a GOP
    at a time, with the GOPs either side decoded ahead on a worker; up to `cache_mb` of them are kept
    (the whole idle loop of a 6 s stretch at 1080×1920 fits the default, so each is decoded once). A
    format-1 bundle's I420 copies are built once into its cache/ folder and memory-mapped. Scaled copies
    are never written to the bundle: they are made in memory, one frame when it is first needed, and live
    as long as the store (see `SharedBaseFrames`)."""

    def __init__(
        self,
        bundle: AvatarBundle,
        output_size: tuple[int, int] | None = None,
        cache_mb: int = DEFAULT_FRAME_CACHE_MB,
    ) -> None:
        self.bundle = bundle
        src_w, src_h = bundle.size
        self.width, self.height = output_size or (src_w, src_h)
        self.scale = self.width / src_w
        self._scaled = (self.width, self.height) != (src_w, src_h)
        self._i420: np.ndarray | None = None
        self._loop: GopReader | None = None  # format 2: loop.mp4, decoded on demand
        self._positions: np.ndarray | None = None
        self._decoding = False  # nothing is decoded until asked for (a patch-mode session never asks)
        video = bundle.manifest.video
        if video is not None and bundle.loop_video is not None:
            # scaled stores decode at the avatar's size too (then scale once per frame): the same reader
            # layout, with a budget of one GOP since each frame is read once
            self._positions = loop_positions(bundle.idle_loop, bundle.frame_count)
            native_even = not (src_w % 2 or src_h % 2)
            fmt = "yuv420p" if native_even else "rgb24"
            budget = cache_mb << 20 if not self._scaled else 0
            self._loop = GopReader(
                bundle.loop_video, video.loop_frames, (src_w, src_h), video.gop, fmt, budget, prefetch=True
            )
        self._built: np.ndarray | None = None  # scaled stores: which in-memory I420 frames exist yet
        self._alloc_lock = threading.Lock()
        self._regions: dict[int, np.ndarray] = {}  # scaled RGB under each frame's mouth rectangle

    def _native_rgb(self, index: int) -> np.ndarray:
        """Base frame `index` as RGB at the avatar's size: from the loop video (format 2) or frames.npy."""
        if self._loop is None:
            return self.bundle.frames[index]
        position = self._loop_position(index)
        if self._loop.pixel_format == "rgb24":
            return self._loop[position]
        return cv2.cvtColor(self._loop.i420(position), cv2.COLOR_YUV2RGB_I420)

    def _loop_position(self, index: int) -> int:
        assert self._positions is not None
        self.decode_ahead()
        position = int(self._positions[index])
        if position < 0:
            raise IndexError(f"frame {index} of avatar '{self.bundle.name}' is not in its idle loop")
        return position

    def decode_ahead(self) -> None:
        """Start decoding the loop's pictures on the decode-ahead thread (format 2; once; all of them when
        they fit the cache), so that what comes next (features, the engine) overlaps it. Asking for any
        picture does this too; a patch-mode session never does."""
        if self._loop is None or self._decoding:
            return
        self._decoding = True
        assert self._positions is not None
        shown = int(self._positions.max()) + 1  # the loop's first pass holds every shown frame
        width, height = self.bundle.size
        fits = shown * width * height * 3 // 2 <= self._loop.budget_bytes
        for g in range(-(-shown // self._loop.gop) if fits else 1):
            self._loop.decode_ahead(g)

    def rgb(self, index: int) -> np.ndarray:
        """Base frame `index` as H×W×3 RGB at the output size (read-only when not scaled; a scaled frame
        is made on each call: the hot path reads `rgb_region` or the I420 pictures instead)."""
        frame = self._native_rgb(index)
        if not self._scaled:
            return frame
        return cv2.resize(np.asarray(frame), (self.width, self.height), interpolation=cv2.INTER_AREA)

    def rgb_region(self, index: int, rect: tuple[int, int, int, int]) -> np.ndarray:
        """RGB of base frame `index` inside `rect` (x0, y0, x1, y1) at the output size. Scaled regions are
        cut from the scaled frame once and kept (the rectangle of a frame never changes), which keeps
        the pixels identical to the full scaled frame while holding only the small rectangles."""
        x0, y0, x1, y1 = rect
        if not self._scaled and self._loop is None:
            return self.bundle.frames[index][y0:y1, x0:x1]
        region = self._regions.get(index)
        if region is None:
            if self._scaled or self._loop is None or self._loop.pixel_format == "rgb24":
                region = self.rgb(index)[y0:y1, x0:x1].copy()
            else:  # only the rectangle is colour-converted (it is even-aligned: whole chroma samples)
                region = cv2.cvtColor(
                    cut_i420(self.i420(index), self.width, self.height, rect), cv2.COLOR_YUV2RGB_I420
                )
            self._regions[index] = region
        return region

    def i420(self, index: int) -> np.ndarray:
        """Base frame `index` as an I420 picture [(H*3/2), W] at the output size."""
        if self._scaled:
            return self._scaled_i420(index)
        if self._loop is not None:
            if self._loop.pixel_format != "yuv420p":
                raise ValueError(
                    f"avatar '{self.bundle.name}' is {self.width}x{self.height}: no I420 at odd sizes"
                )
            return self._loop.i420(self._loop_position(index))
        if self._i420 is None:
            self._i420 = self._load_or_build()
        return self._i420[index]

    def _scaled_i420(self, index: int) -> np.ndarray:
        if self._i420 is None or self._built is None:
            with self._alloc_lock:  # sessions sharing this store may warm up at the same time
                if self._i420 is None or self._built is None:
                    shape = (self.bundle.frame_count, *i420_shape(self.width, self.height))
                    # one allocation: its pages are touched (and counted) only as frames are built, and
                    # it goes back to the OS in one piece when the store is dropped
                    self._built = np.zeros(shape[0], dtype=bool)
                    self._i420 = np.empty(shape, dtype=np.uint8)
        if not self._built[index]:
            # two threads may build the same frame at once: they write the same bytes
            self._i420[index] = cv2.cvtColor(np.ascontiguousarray(self.rgb(index)), cv2.COLOR_RGB2YUV_I420)
            self._built[index] = True
        return self._i420[index]

    @property
    def rgb_matches_i420(self) -> bool:
        """True when `rgb_region` converted to I420 gives back the I420 picture bit for bit (the I420 was
        made from that RGB); False when the RGB is itself converted from decoded I420 (format 2 at the
        avatar's size), where a round trip may move a value by one."""
        return self._loop is None or self._scaled

    @property
    def resident_bytes(self) -> int:
        """Decoded pictures this store holds in memory now (format 2 and scaled stores)."""
        loop = self._loop.cached_bytes if self._loop is not None else 0
        made = (
            int(self._built.sum()) * self._i420[0].nbytes
            if self._built is not None and self._i420 is not None
            else 0
        )
        return loop + made + sum(r.nbytes for r in self._regions.values())

    def _cache_path(self) -> Path:
        return self.bundle.path / CACHE_DIR / f"frames_i420_{self.width}x{self.height}.npy"

    def _load_or_build(self) -> np.ndarray:
        path = self._cache_path()
        shape = (self.bundle.frame_count, *i420_shape(self.width, self.height))
        if path.is_file():
            try:
                cached = np.load(path, mmap_mode="r")
                if cached.shape == shape:
                    return cached
            except (OSError, ValueError):
                pass  # a damaged cache is rebuilt below
        try:
            return self._build_on_disk(path, shape)
        except OSError as exc:  # read-only bundle: keep the copies in memory instead
            log.warning("cannot cache I420 frames in %s (%s); converting in memory", path.parent, exc)
            return np.stack([cv2.cvtColor(self.rgb(i), cv2.COLOR_RGB2YUV_I420) for i in range(shape[0])])

    def _build_on_disk(self, path: Path, shape: tuple[int, int, int]) -> np.ndarray:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".frames_i420.", suffix=".npy")
        os.close(fd)
        try:
            out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.uint8, shape=shape)
            for i in range(shape[0]):
                out[i] = cv2.cvtColor(np.ascontiguousarray(self.rgb(i)), cv2.COLOR_RGB2YUV_I420)
            out.flush()
            del out
            os.replace(tmp, path)  # atomic: concurrent builders just replace each other's identical file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return np.load(path, mmap_mode="r")


class SharedBaseFrames:
    """One BaseFrameStore per avatar and output size for all the sessions of a server; a store is
    dropped (and its memory freed) when the last session holding it ends."""

    def __init__(self) -> None:
        self._stores: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._lock = threading.Lock()

    def get(self, bundle: AvatarBundle, output_size: tuple[int, int]) -> BaseFrameStore:
        """The shared store of `bundle`'s frames at `output_size` (made when none is alive)."""
        key = (str(Path(bundle.path).resolve()), bundle.frame_count, tuple(output_size))
        with self._lock:
            store = self._stores.get(key)
            if store is None:
                store = BaseFrameStore(bundle, output_size)
                self._stores[key] = store
            return store

    def __len__(self) -> int:
        return len(self._stores)

"""The encoded idle loop made ahead and kept on disk, so no stream spends its first pass through the loop
encoding it (idle_gops.py replays what is cached).

When a stream of an avatar at a size starts and its idle loop is neither in memory nor in the avatar's
cache/ folder, one background thread at the lowest priority encodes the whole loop (the live stream's encoder
and settings, an IDR at each GOP start) and writes it to cache/ for later sessions and later server starts.
It takes only CPU nothing else wants; the streams record the GOPs they encode meanwhile, as before. A
read-only bundle keeps the loop in memory only."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path

import av
import numpy as np

from lipstream.audio.timeline import FPS
from lipstream.avatar.bundle import AvatarBundle
from lipstream.files import atomic_file
from lipstream.media.h264 import EncodedUnit, H264StreamEncoder
from lipstream.render.base_frames import BaseFrameStore
from lipstream.render.compositor import Compositor
from lipstream.render.idle_gops import IdleGops
from lipstream.threads import lower_thread_priority

log = logging.getLogger(__name__)

FILL_NICENESS = 19  # the fill runs on CPU time nothing else wants
FILL_FRAME_CACHE_MB = 64  # the fill's own decoded frames: a few GOPs (it reads the loop in order)
# what makes cached units fit the live stream: a new PyAV / FFmpeg (x264 inside) writes a new file, and so
# does a change of H264StreamEncoder's settings (bump SETTINGS_VERSION with it)
SETTINGS_VERSION = 1
LAVC_VERSION = ".".join(map(str, av.library_versions.get("libavcodec", ())))
ENCODER_TAG = f"v{SETTINGS_VERSION}-av{av.__version__}-lavc{LAVC_VERSION}"

Pictures = Callable[[int], np.ndarray]  # loop position -> the idle I420 picture shown there


def cache_file(bundle_path: Path, size: tuple[int, int], bitrate: int, gop: int) -> Path:
    """Where the avatar's encoded idle loop at this size and bitrate is kept."""
    return Path(bundle_path) / "cache" / f"idle_gops_{size[0]}x{size[1]}_{bitrate}_{gop}.npz"


def save(gops: IdleGops, path: Path) -> bool:
    """Write a whole encoded loop (False, and nothing written, if it is not whole or cannot be written)."""
    units = [unit for start in range(0, gops.loop_length, gops.gop) for unit in gops.get(start) or ()]
    if len(units) != gops.loop_length:
        return False
    offsets = np.cumsum([0, *(len(u.data) for u in units)], dtype=np.int64)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path) as out:
            np.savez(
                out, data=np.frombuffer(b"".join(u.data for u in units), np.uint8), offsets=offsets,
                keyframes=np.array([u.keyframe for u in units]), gop=gops.gop, encoder=ENCODER_TAG,
            )  # fmt: skip
    except OSError as exc:
        log.info("idle loop not cached in %s (%s); it stays in memory", path.parent, exc)
        return False
    return True


def load(gops: IdleGops, path: Path) -> bool:
    """Read a cached loop into `gops` (False when there is none, or it was made for other settings)."""
    try:
        with np.load(path) as saved:
            if str(saved["encoder"]) != ENCODER_TAG or int(saved["gop"]) != gops.gop:
                return False
            data, offsets, keyframes = saved["data"].tobytes(), saved["offsets"], saved["keyframes"]
    except (OSError, ValueError, KeyError, SystemError):
        # none, or damaged: encoded again. SystemError: np.load parses its header with ast, whose depth
        # count CPython 3.11 keeps across threads: two sessions warming up at once failed one
        return False
    if len(keyframes) != gops.loop_length or len(offsets) != len(keyframes) + 1:
        return False
    bounds = zip(offsets[:-1], offsets[1:], keyframes, strict=True)
    units = [EncodedUnit(data[a:b], bool(key), 0) for a, b, key in bounds]
    starts = range(0, gops.loop_length, gops.gop)
    if not all(units[start].keyframe for start in starts):  # damaged: encoded again
        return False
    for start in starts:
        gops.put(start, tuple(units[start : start + gops.length(start)]))
    return True


def encode_loop(gops: IdleGops, pictures: Pictures, size: tuple[int, int], bitrate: int) -> None:
    """Encode every GOP of the loop not cached yet, as the live stream would (one thread)."""
    encoder = H264StreamEncoder(*size, fps=FPS, bitrate=bitrate, threads=1)
    for start in range(0, gops.loop_length, gops.gop):
        if gops.get(start) is not None:
            continue
        units = tuple(
            encoder.encode(pictures(position), force_idr=position == start)
            for position in range(start, start + gops.length(start))
        )
        gops.put(start, units)


def own_pictures(bundle: AvatarBundle, size: tuple[int, int]) -> Pictures:
    """The idle pictures at `size` from frames this caller decodes itself: a fill at nice 19 must never be
    decoding a GOP of the server's shared store that a render thread then waits for."""
    compositor = Compositor(bundle, output_size=size, base=BaseFrameStore(bundle, size, FILL_FRAME_CACHE_MB))
    return lambda position: compositor.compose_i420(bundle.base_frame_index(position), None)


def fill(
    gops: IdleGops, path: Path, pictures: Callable[[], Pictures], size: tuple[int, int], bitrate: int
) -> None:
    """Make `gops` whole: read it from `path`, or encode it on a background thread (with the pictures
    `pictures()` gives, there) and write it to `path`. Once per loop: later calls return at once."""
    if not gops.claim_fill():
        return
    if load(gops, path):
        return

    def run() -> None:
        lower_thread_priority(FILL_NICENESS)
        try:
            encode_loop(gops, pictures(), size, bitrate)
            save(gops, path)
        except Exception:  # noqa: BLE001 - the streams go on recording the loop themselves
            log.exception("encoding the idle loop ahead failed")

    threading.Thread(target=run, name=f"idle loop {size[0]}x{size[1]}", daemon=True).start()

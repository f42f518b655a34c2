"""The whole-frame stream's idle pictures, encoded once: while the avatar is idle, the stream sends again the
access units it encoded on its first pass through the idle loop instead of compositing and encoding the same
pictures again.

An idle picture depends only on its place in the loop (the footage frame, no mouth patch, no lids), so a
closed stretch of them as the encoder made it (an IDR at a GOP start, then the P frames up to the next start)
decodes to the same pictures wherever it is sent, provided it is sent whole from its IDR. The first pass
records each GOP as it is encoded (an IDR is forced at each GOP start not cached yet); from then on an idle
stretch that reaches a GOP start is replayed and costs no encode. Speech, a lowered lid, an interrupt or a
keyframe request hands the stream back to the live encoder with an IDR; the replay takes over again at the
next idle GOP start. A 1080x1920 idle stream costs x264 veryfast ~16 ms a frame, 0.4 of a 2-core machine,
which recognition and the model need while the user speaks (docs/conversation.md)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

from lipstream.audio.timeline import FPS
from lipstream.avatar.bundle import AvatarBundle
from lipstream.media.h264 import EncodedUnit

# 2 s: the stream is back on the replay at most this long after speech ends, and the first pass adds an IDR
# this often (the live stream's own GOP is 4 s)
IDLE_GOP_FRAMES = 2 * FPS
# encoded idle loops a server keeps (avatar x stream size x bitrate); each is ~10 kB a frame at 2.5 Mb/s
MAX_SHARED_LOOPS = 8

Gop = tuple[EncodedUnit, ...]


class IdleGops:
    """One avatar's idle loop at one stream size and bitrate, encoded GOP by GOP as sessions pass through
    it; thread-safe, shared by the sessions that stream it."""

    def __init__(self, loop_length: int, gop: int = IDLE_GOP_FRAMES) -> None:
        if loop_length <= 0:
            raise ValueError(f"the idle loop must have frames, got {loop_length}")
        self.loop_length = loop_length
        self.gop = max(1, min(gop, loop_length))
        self._gops: dict[int, Gop] = {}
        self._lock = threading.Lock()
        self._fill_claimed = False

    def claim_fill(self) -> bool:
        """True for the first caller only: that one makes the loop whole (idle_loop_fill.py)."""
        with self._lock:
            claimed, self._fill_claimed = self._fill_claimed, True
            return not claimed

    def starts_gop(self, position: int) -> bool:
        """Whether a GOP starts at this loop position."""
        return position % self.gop == 0

    def length(self, start: int) -> int:
        """Frames in the GOP starting at `start` (the loop's last one may be shorter)."""
        return min(self.gop, self.loop_length - start)

    def get(self, start: int) -> Gop | None:
        """The GOP starting at `start`, if a session has recorded it."""
        with self._lock:
            return self._gops.get(start)

    def put(self, start: int, units: Gop) -> None:
        """Keep a recorded GOP (whole, from its IDR; the first one recorded stays)."""
        if not self.starts_gop(start) or len(units) != self.length(start) or not units[0].keyframe:
            raise ValueError(f"not a whole GOP at loop position {start}")
        with self._lock:
            self._gops.setdefault(start, units)

    @property
    def cached_frames(self) -> int:
        """Loop positions whose access units are cached."""
        with self._lock:
            return sum(len(units) for units in self._gops.values())


class SharedIdleGops:
    """One IdleGops per avatar, stream size and bitrate for all the sessions of a server (the most recently
    used `max_loops` of them)."""

    def __init__(self, max_loops: int = MAX_SHARED_LOOPS) -> None:
        self.max_loops = max_loops
        self._loops: OrderedDict[tuple, IdleGops] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, bundle: AvatarBundle, size: tuple[int, int], bitrate: int) -> IdleGops:
        """The shared encoded idle loop of `bundle` at `size` and `bitrate` (made empty if there is none)."""
        loop_length = len(bundle.idle_loop)
        key = (str(Path(bundle.path).resolve()), bundle.frame_count, loop_length, tuple(size), bitrate)
        with self._lock:
            loop = self._loops.get(key)
            if loop is None:
                loop = self._loops[key] = IdleGops(loop_length)
                while len(self._loops) > self.max_loops:
                    self._loops.popitem(last=False)
            self._loops.move_to_end(key)
            return loop


class IdleReplay:
    """One stream's side of the cache: the idle frames it replays, and the GOPs it records."""

    def __init__(self, gops: IdleGops) -> None:
        self.gops = gops
        self.replayed = 0  # frames sent from the cache
        self._playing: Gop | None = None  # the GOP being replayed, from `_play_start`
        self._play_start = 0
        self._play_generation = 0
        self._played = 0  # of `_playing`'s units, sent
        self._recording: list[EncodedUnit] | None = None  # the GOP being recorded, from `_record_start`
        self._record_start = 0
        self._record_generation = 0

    def next(self, position: int, generation: int, key: bool = False) -> EncodedUnit | None:
        """The cached access unit of the idle frame at loop `position`, or None: it is encoded live. `key`:
        the picture must decode on its own, so only a GOP's first unit will do."""
        if key:
            self._playing = None
        if self._playing is not None:
            offset = position - self._play_start
            if generation == self._play_generation and offset == self._played and offset < len(self._playing):
                self._played += 1
                self.replayed += 1
                return self._playing[offset]
            self._playing = None
        units = self.gops.get(position) if self.gops.starts_gop(position) else None
        if units is None:
            return None
        self._playing, self._play_start, self._play_generation, self._played = units, position, generation, 1
        self._recording = None
        self.replayed += 1
        return units[0]

    def stop(self) -> None:
        """The live encoder takes the stream (the replayed GOP is left mid-way)."""
        self._playing = None

    def wants_idr(self, position: int) -> bool:
        """Whether an idle frame encoded live here should be an IDR: it starts a GOP not cached yet."""
        return self.gops.starts_gop(position) and self.gops.get(position) is None

    def encoded(self, position: int, generation: int, unit: EncodedUnit, idle: bool) -> None:
        """A frame was encoded live: an idle one extends (or starts) the GOP being recorded."""
        rec = self._recording
        if rec is not None and idle and generation == self._record_generation:
            if position == self._record_start + len(rec):
                rec.append(unit)
                if len(rec) == self.gops.length(self._record_start):
                    self.gops.put(self._record_start, tuple(rec))
                    self._recording = None
                return
        self._recording = None
        if idle and unit.keyframe and self.wants_idr(position):
            self._recording, self._record_start, self._record_generation = [unit], position, generation
            if self.gops.length(position) == 1:
                self.gops.put(position, (unit,))
                self._recording = None

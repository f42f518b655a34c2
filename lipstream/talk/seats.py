"""The conversations a server answers at once: a place for each (a seat), a queue for the visitors beyond.

The recogniser, the language model and the answer voices of a server are shared by every conversation; on a
small machine two or three conversations answered at once each answer late (issue 49: on 2 cores, 0.9 s
with one, 2.6 s p50 with three, 14 s worst with six). So a conversation holds a seat while its session
lives; a visitor beyond `capacity` waits in order of arrival (their conversation listens, tells them to wait
and writes no answer until a seat frees, then answers the question they asked meanwhile), and one beyond
`capacity + max_waiting` is refused at once with a clear error.

A seat is sized by what its conversation costs the box: a whole-frame stream's speaking frames are encoded on
the server (x264: the server used 0.7 of a core for one at 1080 px, 1.1 for two), the page's patch stream
sends only the mouth (a few ms a frame), so a conversation on it takes half a seat (`PATCH_SEAT`): 2 cores
answer two whole-frame conversations at pace, or four on the patch stream (docs/benchmarks.md, "Several
conversations at once").
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass

from lipstream.errors import LipstreamError
from lipstream.threads import usable_cores

# conversations answered at pace per core: measured with `python -m benchmarks conversations` (2 cores,
# embedded models, docs/benchmarks.md "Several conversations at once"): one conversation per core
CONVERSATIONS_PER_CORE = 1.0
# the share of a seat a conversation on the page's patch stream takes: with whole frames two at once were
# answered at pace on 2 cores (p50 853, p90 1003 ms) and three were not; on the patch stream four were near
# it (p50 815-1037, p90 1562-1802 ms in three runs on an Intel Xeon, 2026-12-07/08; docs/benchmarks.md)
PATCH_SEAT = 0.5
DEFAULT_MAX_WAITING = 4  # visitors told to wait before the next is refused
DEFAULT_IDLE_SECONDS = 60.0  # a seat unused this long goes to a visitor in line who asks something


class SeatsFull(LipstreamError):
    """Every seat is taken and the queue is full: the visitor is refused."""


def seat_size(patch_stream: bool) -> float:
    """The share of a seat a conversation takes: PATCH_SEAT on the page's patch stream, a whole one else."""
    return PATCH_SEAT if patch_stream else 1.0


def default_capacity(cores: int | None = None) -> int:
    """Conversations this machine answers at pace: one per core (measured on 2 cores), at least one."""
    cores = cores if cores is not None else usable_cores()
    return max(1, int(cores * CONVERSATIONS_PER_CORE))


@dataclass(frozen=True)
class SeatCounts:
    """Conversations answered now, waiting for a seat, and refused since the server started."""

    capacity: int
    active: int
    waiting: int
    refused: int
    max_waiting: int
    taken: float  # the seats the active conversations take (a patch-stream one takes PATCH_SEAT)

    def as_dict(self) -> dict[str, float]:
        """JSON-ready (for /healthz)."""
        return asdict(self)


class Seat:
    """One conversation's place: seated (answered now) or waiting in line."""

    def __init__(self, seats: ConversationSeats, size: float = 1.0) -> None:
        """`size`: the share of a seat it takes (a patch-stream conversation: PATCH_SEAT)."""
        self._seats = seats
        self.size = size
        self._granted = asyncio.Event()
        self.released = False
        self.active_at = seats.clock()  # the conversation's last sign of life (a turn, an answer)

    def touch(self) -> None:
        """The conversation is in use now (the user speaks, the avatar answers)."""
        self.active_at = self._seats.clock()

    @property
    def seated(self) -> bool:
        """Its answers are written now."""
        return self._granted.is_set()

    @property
    def position(self) -> int:
        """0 when seated; else how many visitors are before it in line, plus one."""
        return self._seats.position(self)

    async def wait(self) -> None:
        """Return once seated."""
        await self._granted.wait()

    def watch(self) -> asyncio.Event:
        """An event set whenever the line moves (clear it after each wake)."""
        return self._seats.watch()

    def unwatch(self, event: asyncio.Event) -> None:
        """Stop telling `event`."""
        self._seats.unwatch(event)

    def reclaim_idle(self) -> int:
        """Its conversation in line asked something: seats left unused for long go to the line."""
        return self._seats.reclaim_idle()

    def grant(self) -> None:
        """Seat it (the seats' own call)."""
        self.active_at = self._seats.clock()
        self._granted.set()

    def unseat(self) -> None:
        """Back in line (the seats' own call)."""
        self._granted.clear()

    def release(self) -> None:
        """Give the seat (or the place in line) back (idempotent)."""
        if not self.released:
            self.released = True
            self._seats.release(self)


class ConversationSeats:
    """At most `capacity` seated conversations and `max_waiting` in line, for one server."""

    def __init__(
        self, capacity: int, max_waiting: int, idle_seconds: float = DEFAULT_IDLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`idle_seconds`: a seated conversation unused this long gives its seat to a visitor in line who
        asks something (and goes to the back of the line)."""
        if capacity < 1 or max_waiting < 0 or idle_seconds <= 0:
            raise ValueError("capacity must be at least 1, max_waiting at least 0, idle_seconds above 0")
        self.capacity = capacity
        self.max_waiting = max_waiting
        self.idle_seconds = idle_seconds
        self.clock = clock
        self._seated: dict[Seat, None] = {}  # in the order seated: idle ones of equal age leave in that order
        self._line: deque[Seat] = deque()
        self._refused = 0
        self._watchers: list[asyncio.Event] = []

    def take(self, size: float = 1.0) -> Seat:
        """A seat of `size` (a share of one: PATCH_SEAT for the patch stream), or a place in line; raises
        SeatsFull when both are full. Nobody is seated before those already in line."""
        seat = Seat(self, size)
        if not self._line and self._fits(seat):
            self._seated[seat] = None
            seat.grant()
        elif len(self._line) < self.max_waiting:
            self._line.append(seat)
        else:
            self._refused += 1
            raise SeatsFull(
                f"this server answers {len(self._seated)} conversation(s) at once and {len(self._line)} "
                "visitor(s) are already waiting; try again in a minute (the operator can raise "
                "--max-conversations or --max-waiting, or add replicas)"
            )
        return seat

    def release(self, seat: Seat) -> None:
        """A conversation ended: its seat goes to the first in line."""
        if seat in self._seated:
            self._seated.pop(seat, None)
            self._seat_the_line()
        elif seat in self._line:
            self._line.remove(seat)
        self._line_moved()

    def reclaim_idle(self) -> int:
        """A visitor in line asked something: every seated conversation idle for `idle_seconds` goes to the
        back of the line and its seat to the first in line (a kiosk left open must not hold a seat for
        good). Returns how many seats changed hands."""
        now = self.clock()
        idle = [s for s in self._seated if now - s.active_at >= self.idle_seconds]
        idle.sort(key=lambda s: s.active_at)
        waiting = set(self._line)  # those in line before this call: as many seats as they need, no more
        moved = 0
        for seat in idle:
            if not waiting & set(self._line):
                break
            self._seated.pop(seat, None)
            seat.unseat()
            self._line.append(seat)  # behind those who waited
            self._seat_the_line()
            moved += 1
        if moved:
            self._line_moved()
        return moved

    def _fits(self, seat: Seat) -> bool:
        return self.taken() + seat.size <= self.capacity + 1e-9

    def taken(self) -> float:
        """The seats the seated conversations take."""
        return sum(seat.size for seat in self._seated)

    def _seat_the_line(self) -> None:
        """Seat the first in line while their seats fit (in order: nobody jumps the line)."""
        while self._line and self._fits(self._line[0]):
            seat = self._line.popleft()
            self._seated[seat] = None
            seat.grant()

    def _line_moved(self) -> None:
        for watcher in self._watchers:  # the waiting are told their new place
            watcher.set()

    def position(self, seat: Seat) -> int:
        """0 when seated; its place in line (1 = next) otherwise."""
        if seat in self._seated:
            return 0
        return self._line.index(seat) + 1 if seat in self._line else 0

    def watch(self) -> asyncio.Event:
        """An event set whenever the line moves (cleared by the watcher)."""
        event = asyncio.Event()
        self._watchers.append(event)
        return event

    def unwatch(self, event: asyncio.Event) -> None:
        """Stop telling `event`."""
        if event in self._watchers:
            self._watchers.remove(event)

    def counts(self) -> SeatCounts:
        """Seated, waiting and refused conversations."""
        return SeatCounts(
            capacity=self.capacity, active=len(self._seated), waiting=len(self._line), refused=self._refused,
            max_waiting=self.max_waiting, taken=self.taken(),
        )  # fmt: skip

"""The server's conversation seats (lipstream.talk.seats): who is answered, who waits, who is refused."""

from __future__ import annotations

import asyncio

import pytest

from lipstream.talk.seats import PATCH_SEAT, ConversationSeats, SeatsFull, default_capacity, seat_size


def test_seats_fill_then_the_line_then_refuse() -> None:
    async def main() -> None:
        seats = ConversationSeats(capacity=2, max_waiting=1)
        a, b = seats.take(), seats.take()
        c = seats.take()
        assert (a.seated, b.seated, c.seated) == (True, True, False)
        assert (a.position, c.position) == (0, 1)
        with pytest.raises(SeatsFull, match="2 conversation.*1 visitor.*--max-conversations"):
            seats.take()
        assert seats.counts().as_dict() == {
            "capacity": 2, "active": 2, "waiting": 1, "refused": 1, "max_waiting": 1, "taken": 2.0,
        }  # fmt: skip
        moved = c.watch()
        a.release()
        await asyncio.wait_for(c.wait(), 1)  # the first in line takes the freed seat
        assert moved.is_set() and c.seated and c.position == 0
        a.release()  # idempotent: nobody else is seated by a second release
        assert seats.counts().active == 2 and seats.counts().waiting == 0

    asyncio.run(main())


def test_the_line_keeps_its_order_and_a_leaver_loses_its_place() -> None:
    async def main() -> None:
        seats = ConversationSeats(capacity=1, max_waiting=3)
        first = seats.take()
        second, third, fourth = seats.take(), seats.take(), seats.take()
        assert [s.position for s in (second, third, fourth)] == [1, 2, 3]
        third.release()  # left the line: the others move up, nobody is seated
        assert [second.position, fourth.position] == [1, 2] and not fourth.seated
        first.release()
        assert second.seated and fourth.position == 1
        second.release()
        assert fourth.seated and seats.counts().active == 1

    asyncio.run(main())


def test_default_capacity_is_one_per_core_and_at_least_one() -> None:
    assert default_capacity(2) == 2
    assert default_capacity(16) == 16
    assert default_capacity(0) == 1
    with pytest.raises(ValueError):
        ConversationSeats(capacity=0, max_waiting=0)


def test_a_seat_left_unused_goes_to_a_visitor_in_line_who_asks() -> None:
    async def main() -> None:
        now = [0.0]
        seats = ConversationSeats(capacity=2, max_waiting=2, idle_seconds=60, clock=lambda: now[0])
        busy, idle, waiting = seats.take(), seats.take(), seats.take()
        now[0] = 50.0
        busy.touch()  # still in use
        now[0] = 70.0
        assert seats.reclaim_idle() == 1  # only the seat unused for 60 s changes hands
        assert waiting.seated and busy.seated and not idle.seated and idle.position == 1
        assert seats.reclaim_idle() == 0  # nobody idle is seated now (the new one was seated at 70)
        now[0] = 200.0
        assert seats.reclaim_idle() == 2 - 1  # both seated are idle, but one visitor is in line
        assert idle.seated and seats.counts().active == 2 and seats.counts().waiting == 1

    asyncio.run(main())


def test_a_patch_stream_conversation_takes_half_a_seat_and_nobody_jumps_the_line() -> None:
    async def main() -> None:
        assert (seat_size(True), seat_size(False)) == (PATCH_SEAT, 1.0) == (0.5, 1.0)
        seats = ConversationSeats(capacity=2, max_waiting=3)
        patches = [seats.take(seat_size(True)) for _ in range(3)]
        whole = seats.take(seat_size(False))  # 1.5 taken: a whole seat does not fit
        late_patch = seats.take(seat_size(True))  # it would fit, but the whole one is first in line
        assert [p.seated for p in patches] == [True, True, True]
        assert (whole.position, late_patch.position) == (1, 2)
        assert seats.counts().taken == 1.5 and seats.counts().active == 3
        patches[0].release()  # 1.0 taken: the whole one is seated, then the line is full again
        assert whole.seated and not late_patch.seated and seats.counts().taken == 2.0
        patches[1].release()
        assert late_patch.seated and seats.counts().taken == 2.0 and seats.counts().waiting == 0

    asyncio.run(main())


def test_idle_half_seats_are_reclaimed_until_the_one_in_line_fits() -> None:
    async def main() -> None:
        now = [0.0]
        seats = ConversationSeats(capacity=1, max_waiting=3, idle_seconds=60, clock=lambda: now[0])
        a, b = seats.take(PATCH_SEAT), seats.take(PATCH_SEAT)
        whole = seats.take(1.0)
        now[0] = 70.0
        assert seats.reclaim_idle() == 2  # two half seats make room for one whole
        assert whole.seated and (a.position, b.position) == (1, 2)

    asyncio.run(main())

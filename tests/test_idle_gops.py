"""The whole-frame stream replays its idle loop: the first pass through the loop is encoded (and recorded GOP
by GOP), later idle stretches are sent from the cache without an encode, and the stream decodes as one with a
real H.264 decoder, to the same pictures, across every switch between replay and live encoding."""

from __future__ import annotations

import time

import numpy as np
import pytest
from test_media_h264 import decode_units

from lipstream.edge.onnx_gate import psnr_db
from lipstream.media.h264 import EncodedUnit, nal_types
from lipstream.render import idle_loop_fill
from lipstream.render.compositor import Compositor
from lipstream.render.idle_gops import IdleGops, IdleReplay, SharedIdleGops
from lipstream.render.sinks import WholeFrameH264
from lipstream.render.timing import StageTimer

NAL_SPS_PPS = {7, 8}  # an IDR that starts a GOP carries the parameter sets: a player can join there


def unit(keyframe: bool, tag: int = 0) -> EncodedUnit:
    """A stand-in access unit for the cache's bookkeeping (the decoding tests below use real ones)."""
    return EncodedUnit(bytes([tag]), keyframe, 0)


def test_the_cache_keeps_whole_gops_from_their_idr_only() -> None:
    gops = IdleGops(loop_length=7, gop=3)
    assert [p for p in range(7) if gops.starts_gop(p)] == [0, 3, 6]
    assert [gops.length(p) for p in (0, 3, 6)] == [3, 3, 1]  # the loop's last GOP is shorter
    with pytest.raises(ValueError, match="whole GOP"):
        gops.put(0, (unit(True), unit(False)))  # short
    with pytest.raises(ValueError, match="whole GOP"):
        gops.put(0, (unit(False), unit(False), unit(False)))  # not from an IDR
    with pytest.raises(ValueError, match="whole GOP"):
        gops.put(1, (unit(True), unit(False), unit(False)))  # not at a GOP start
    first = (unit(True, 1), unit(False, 2), unit(False, 3))
    gops.put(0, first)
    gops.put(0, (unit(True, 9), unit(False, 9), unit(False, 9)))
    assert gops.get(0) == first and gops.cached_frames == 3  # the first recorded stays
    assert IdleGops(loop_length=2, gop=50).gop == 2  # a loop shorter than a GOP is one GOP
    with pytest.raises(ValueError):
        IdleGops(loop_length=0)


def test_a_replay_records_a_pass_and_replays_only_from_a_gop_start() -> None:
    gops = IdleGops(loop_length=6, gop=3)
    replay = IdleReplay(gops)
    assert replay.next(0, 0) is None and replay.wants_idr(0)
    for position in range(6):  # the first pass: encoded live, an IDR at each GOP start
        replay.encoded(position, 0, unit(position % 3 == 0, position), idle=True)
    assert gops.cached_frames == 6
    assert replay.next(1, 0) is None  # mid-GOP: nothing to start from
    assert [replay.next(p, 0).data[0] for p in (3, 4, 5, 0, 1)] == [3, 4, 5, 0, 1]
    assert replay.next(2, 1) is None  # an interrupt (new generation) mid-GOP leaves the replay
    assert replay.next(3, 1).data[0] == 3  # and the next GOP start takes it again
    assert replay.replayed == 6

    fresh = IdleGops(loop_length=6, gop=3)
    broken = IdleReplay(fresh)
    broken.encoded(0, 0, unit(True), idle=True)
    broken.encoded(1, 0, unit(False), idle=False)  # speech mid-GOP: that GOP is not recorded
    broken.encoded(2, 0, unit(False), idle=True)
    assert fresh.cached_frames == 0 and fresh.get(0) is None


def test_shared_loops_are_one_per_avatar_size_and_bitrate(small_avatar) -> None:
    shared = SharedIdleGops(max_loops=2)
    a = shared.get(small_avatar, (360, 640), 2_000_000)
    assert shared.get(small_avatar, (360, 640), 2_000_000) is a
    assert shared.get(small_avatar, (180, 320), 2_000_000) is not a
    assert shared.get(small_avatar, (360, 640), 1_000_000) is not a  # a third: the oldest goes
    assert shared.get(small_avatar, (360, 640), 2_000_000) is not a
    assert a.loop_length == len(small_avatar.idle_loop)


def test_the_stream_replays_idle_gops_and_decodes_as_one(small_avatar) -> None:
    """Two passes through the idle loop with speech in the middle of a GOP: the second idle pass costs no
    encode after the first GOP start, every unit decodes, and each replayed picture is the first pass's."""
    compositor = Compositor(small_avatar, 256, small_avatar.size)
    sink = WholeFrameH264(1_000_000)
    sink.bind(compositor, StageTimer())  # no warm_up: it would fill the loop ahead (tested below)
    sink.open()
    loop = len(small_avatar.idle_loop)
    gop = sink.replay.gops.gop
    assert loop > gop  # the test needs more than one GOP in the loop
    patch = np.full((256, 256, 3), 90, dtype=np.uint8)  # a visibly different mouth: speech
    speech = range(loop + gop // 2, loop + gop // 2 + 10)  # starts and ends mid-GOP
    units: list[EncodedUnit] = []
    encoded_at: dict[int, int] = {}
    for tick in range(3 * loop):
        before = sink.encoder.frames_encoded
        mouth = patch if tick in speech else None
        units.append(sink.make(tick, small_avatar.base_frame_index(tick), mouth, 0))
        encoded_at[tick] = sink.encoder.frames_encoded - before

    assert all(encoded_at[t] == 1 for t in range(loop))  # the first pass is encoded (and recorded)
    assert sink.replay.gops.cached_frames == loop
    assert units[speech[0]].keyframe and encoded_at[speech[0]] == 1  # live speech starts on an IDR
    back = next(t for t in range(speech[-1] + 1, 3 * loop) if (t % loop) % gop == 0)
    assert all(encoded_at[t] == 1 for t in range(speech[-1] + 1, back))  # live until the next GOP start
    assert sum(encoded_at[t] for t in range(back, 3 * loop)) == 0  # then idle costs no encode
    assert sink.replay.replayed == 3 * loop - back + (speech[0] - loop)
    assert all(NAL_SPS_PPS <= set(nal_types(units[t].data)) for t in range(0, loop, gop))

    pictures = decode_units([u.data for u in units], "gray")
    assert len(pictures) == 3 * loop  # nothing lost or left undecodable at a switch
    for tick in [*range(loop, speech[0]), *range(back, 3 * loop)]:  # replayed: exactly the first pass
        assert np.array_equal(pictures[tick], pictures[tick % loop]), tick
    for tick in speech:  # live speech shows the patch, decoded from its own IDR
        assert psnr_db(pictures[tick], pictures[tick % loop]) < 40
    for tick in range(speech[-1] + 1, back):  # live idle after speech: the same pictures, re-encoded
        assert psnr_db(pictures[tick], pictures[tick % loop]) > 35, tick



def test_a_keyframe_request_or_a_lowered_lid_leaves_the_replay(small_avatar) -> None:
    compositor = Compositor(small_avatar, 256, small_avatar.size)
    sink = WholeFrameH264(1_000_000)
    sink.bind(compositor, StageTimer())
    sink.open()
    loop, gop = len(small_avatar.idle_loop), sink.replay.gops.gop
    for tick in range(loop + 2):  # the first pass, and two replayed frames
        sink.make(tick, small_avatar.base_frame_index(tick), None, 0)
    assert sink.replay.replayed == 2
    sink.request_keyframe()  # a client lost its decoder state
    tick = loop + 2
    made = sink.make(tick, small_avatar.base_frame_index(tick), None, 0)
    assert made.keyframe and sink.replay.replayed == 2  # an IDR from the live encoder
    tick += 1
    shut = sink.make(tick, small_avatar.base_frame_index(tick), None, 0, lids=0.8)
    assert sink.replay.replayed == 2 and not shut.keyframe  # a blink is drawn, so encoded live
    while (tick % loop) % gop:
        tick += 1
        sink.make(tick, small_avatar.base_frame_index(tick), None, 0)
    assert sink.replay.replayed == 3  # back on the cache at the next GOP start


def test_a_cache_the_interpreter_fails_to_read_is_encoded_again(tmp_path, monkeypatch) -> None:
    """CPython 3.11 once failed np.load's header parse in one of two sessions warming up at once
    (SystemError 'AST constructor recursion depth mismatch'): that session encodes its loop, as for a
    damaged cache, rather than failing to start."""
    path = tmp_path / "loop.npz"
    np.savez(path, encoder=np.array("x"), gop=np.array(25))

    def racing_load(*_args, **_kwargs):
        raise SystemError("AST constructor recursion depth mismatch (before=42, after=39)")

    monkeypatch.setattr(idle_loop_fill.np, "load", racing_load)
    assert idle_loop_fill.load(IdleGops(50), path) is False


def test_the_loop_filled_ahead_is_kept_on_disk_and_plays_in_a_live_stream(small_avatar, tmp_path) -> None:
    """The background fill encodes the whole loop on one thread and writes it to the cache; a fresh loop
    reads it back unit for unit; a live stream (another encoder, two threads) replays it from its first
    frame, goes live for speech and back, and the whole stream decodes to the filled pictures."""
    compositor = Compositor(small_avatar, 256, small_avatar.size)
    loop, size = len(small_avatar.idle_loop), small_avatar.size

    def picture(position: int) -> np.ndarray:
        return compositor.compose_i420(small_avatar.base_frame_index(position), None)

    path = idle_loop_fill.cache_file(tmp_path / "bundle", size, 1_000_000, IdleGops(loop).gop)
    filled = IdleGops(loop)
    own = idle_loop_fill.own_pictures(small_avatar, size)  # the fill decodes its own frames...
    for position in (0, loop // 2, loop - 1):  # ...to the pictures the live stream composites
        assert np.array_equal(own(position), picture(position))
    half = Compositor(small_avatar, 256, (180, 320))  # a scaled stream too
    own_half = idle_loop_fill.own_pictures(small_avatar, (180, 320))
    assert np.array_equal(own_half(3), half.compose_i420(small_avatar.base_frame_index(3), None))
    idle_loop_fill.fill(filled, path, lambda: own, size, 1_000_000)
    deadline = time.monotonic() + 60
    while not path.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert filled.cached_frames == loop and path.is_file()
    idle_loop_fill.fill(filled, path, lambda: picture, size, 1_000_000)  # claimed once: nothing happens again

    again = IdleGops(loop)
    assert idle_loop_fill.load(again, path)
    for start in range(0, loop, again.gop):
        read, made = again.get(start), filled.get(start)
        assert [(u.data, u.keyframe) for u in read] == [(u.data, u.keyframe) for u in made]
    assert not idle_loop_fill.load(IdleGops(loop, gop=again.gop - 1), path)  # other settings: not used
    with np.load(path) as saved:  # a GOP that does not start on an IDR
        arrays = {k: saved[k] for k in saved.files}
    arrays["keyframes"] = np.zeros_like(arrays["keyframes"])
    np.savez(path, **arrays)
    assert not idle_loop_fill.load(IdleGops(loop), path)
    path.write_bytes(b"damaged")
    assert not idle_loop_fill.load(IdleGops(loop), path)

    shared = SharedIdleGops()
    sink = WholeFrameH264(1_000_000, shared)
    sink.bind(compositor, StageTimer())
    sink.open()
    for start in range(0, loop, again.gop):
        sink.replay.gops.put(start, again.get(start))
    patch = np.full((256, 256, 3), 90, dtype=np.uint8)
    speech = range(7, 17)
    units = [
        sink.make(t, small_avatar.base_frame_index(t), patch if t in speech else None, 0)
        for t in range(loop + 5)
    ]
    assert sink.encoder.frames_encoded < loop  # idle frames came from the filled loop
    pictures = decode_units([u.data for u in units], "gray")
    assert len(pictures) == loop + 5
    reference = decode_units([u.data for s in range(0, loop, again.gop) for u in again.get(s)], "gray")
    for tick in [*range(0, speech[0]), *range(loop, loop + 5)]:
        assert np.array_equal(pictures[tick], reference[tick % loop]), tick

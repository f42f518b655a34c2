"""Blinks at phrase ends: when the machine starts one, and what the compositor draws for it."""

from __future__ import annotations

import numpy as np
import pytest

from lipstream.avatar.blink import IdleBlinks
from lipstream.avatar.bundle import Manifest
from lipstream.avatar.phrase_blinks import PhraseBlinkConfig, PhraseEndBlinks, phrase_chance

FPS = 25


def _run(machine: PhraseEndBlinks, voiced: list[bool], first: int = 0) -> np.ndarray:
    frames = range(first, first + len(voiced))
    steps = zip(frames, voiced, strict=True)
    return np.array([machine.step(k, v, k % machine.loop_length) for k, v in steps])


def _phrases(count: int, voiced_s: float, pause_s: float) -> list[bool]:
    one = [True] * int(round(voiced_s * FPS)) + [False] * int(round(pause_s * FPS))
    return one * count


def _starts(closure: np.ndarray) -> list[int]:
    shut = closure > 0
    return [int(k) for k in np.flatnonzero(shut & ~np.roll(shut, 1))]


def test_the_hash_is_uniform_and_the_same_every_time() -> None:
    draws = np.array([phrase_chance(k) for k in range(20000)])
    assert 0.0 <= draws.min() and draws.max() < 1.0
    assert abs(draws.mean() - 0.5) < 0.01 and abs(np.mean(draws < 0.5) - 0.5) < 0.01
    assert phrase_chance(1234) == phrase_chance(1234)


def test_blinks_start_where_a_pause_confirms_a_phrase_end_at_the_configured_rate() -> None:
    config = PhraseBlinkConfig(gap_s=0.0)
    machine = PhraseEndBlinks(loop_length=300, drawn_starts=[], fps=FPS, config=config)
    voiced = _phrases(200, voiced_s=1.2, pause_s=0.6)
    closure = _run(machine, voiced)
    period, pause = 45, 5  # frames: 30 voiced + 15 silent; a pause of 0.2 s confirms the end
    ends = [p * period + 30 + pause - 1 for p in range(200)]  # the frame the pause is confirmed on
    starts = _starts(closure)
    assert set(starts) <= set(ends)
    assert starts == [k for k in ends if phrase_chance(k) < config.chance]
    assert abs(len(starts) / len(ends) - config.chance) < 0.1
    # one blink lasts 320 ms (8 frames), eased, shut for 3 frames, down faster than up
    k = starts[0]
    curve = closure[k : k + len(machine.curve) + 1]
    assert curve[-1] == 0.0 and curve.max() == 1.0 and np.count_nonzero(curve) == len(machine.curve) == 8
    shut = np.flatnonzero(curve == 1.0)
    assert len(shut) == 3 and shut[0] <= 2 and len(machine.curve) - 1 - shut[-1] > shut[0]


def test_no_blink_after_a_short_burst_a_short_gap_or_near_another_blink() -> None:
    always = PhraseBlinkConfig(chance=1.0, gap_s=0.0)
    # 0.6 s of voice (under min_phrase_s) then a pause: no phrase end
    assert not _run(PhraseEndBlinks(300, [], FPS, always), _phrases(20, 0.6, 0.6)).any()
    # pauses of 0.12 s (a stop consonant, a breath) never confirm a phrase end
    assert not _run(PhraseEndBlinks(300, [], FPS, always), _phrases(20, 1.2, 0.12)).any()
    # with a 2 s gap, phrase ends 1.8 s apart blink every other time
    spaced = PhraseBlinkConfig(chance=1.0, gap_s=2.0)
    starts = _starts(_run(PhraseEndBlinks(10_000, [], FPS, spaced), _phrases(10, 1.2, 0.6)))
    assert len(starts) == 5 and min(np.diff(starts)) >= 2 * FPS
    # a drawn blink of the loop within 2 s (either side, across the loop's wrap) keeps a phrase blink away
    ends = [30 + 5 - 1 + p * 45 for p in range(10)]  # 34, 79, 124 ...: 124 wraps to 4
    clear = PhraseBlinkConfig(chance=1.0, gap_s=1.0)
    near_wrap = PhraseEndBlinks(loop_length=120, drawn_starts=[110], fps=FPS, config=clear)
    shown = _starts(_run(near_wrap, _phrases(10, 1.2, 0.6)))
    distance = [min((110 - k) % 120, (k - 110) % 120) for k in ends]
    assert shown == [k for k, d in zip(ends, distance, strict=True) if d >= FPS]
    assert 0 < len(shown) < len(ends)


def test_a_jump_in_the_timeline_starts_afresh() -> None:
    always = PhraseBlinkConfig(chance=1.0, gap_s=0.0)
    machine = PhraseEndBlinks(300, [], FPS, always)
    _run(machine, [True] * 30)
    # an interrupt moves the timeline back: the voiced run before it does not count
    assert not _run(machine, [False] * 10, first=10).any()


def test_the_manifest_says_where_drawn_blinks_are_and_when_lipstream_draws_none() -> None:
    closure = np.zeros(300, np.float32)
    closure[[40, 41, 42, 200, 201]] = 0.5
    loop = np.arange(300, dtype=np.int32)
    drawn = IdleBlinks(loop, closure, 0, 2, 12.0)
    assert drawn.entry() == {"own": 0, "drawn": 2, "per_minute": 10.0, "starts": [40, 200]}
    own = IdleBlinks(loop, np.zeros(300, np.float32), 3, 0, 12.0, drawing=False)
    assert own.entry() == {"own": 3, "drawn": 0, "per_minute": 15.0}
    fields = {"name": "s", "frame_count": 300, "width": 360, "height": 640, "source_file": "a.png"}
    assert Manifest(**fields, idle={"blinks": drawn.entry()}).drawn_blink_starts() == [40, 200]
    assert PhraseEndBlinks.for_manifest(Manifest(**fields, idle={"blinks": drawn.entry()}), 300) is not None
    assert PhraseEndBlinks.for_manifest(Manifest(**fields, idle={"blinks": own.entry()}), 300) is None
    assert PhraseEndBlinks.for_manifest(Manifest(**fields, idle={}), 300) is None


@pytest.mark.parametrize("i420", [False, True], ids=["rgb", "i420"])
def test_the_compositor_lowers_the_lids_and_touches_nothing_else(small_avatar, i420: bool) -> None:
    from lipstream.render.compositor import Compositor

    compositor = Compositor(small_avatar)
    compose = compositor.compose_i420 if i420 else compositor.compose
    frame = int(small_avatar.idle_loop[0])
    open_eyes = compose(frame, None)
    assert np.array_equal(compose(frame, None, lids=0.0), open_eyes)
    shut = compose(frame, None, lids=1.0)
    x0, y0, x1, y1 = compositor.lids.rect(frame)
    changed = np.argwhere(shut != open_eyes)
    assert len(changed) > 50
    if i420:  # the luma plane's changes lie in the eyes' rectangle; the chroma planes follow it
        luma = changed[changed[:, 0] < compositor.height]
    else:
        luma = changed
    assert luma[:, 0].min() >= y0 and luma[:, 0].max() < y1
    assert luma[:, 1].min() >= x0 and luma[:, 1].max() < x1
    # the eyes' rectangle lies above the nose: the mouth is untouched
    nose_y = float(small_avatar.landmarks[frame][2, 1]) * compositor.base.scale
    assert y1 < nose_y


@pytest.fixture(scope="module")
def phrased_speech() -> np.ndarray:
    """Three espeak-ng sentences with 0.7 s pauses between them and after (16 kHz float32)."""
    from lipstream.talk.voices.tts import create_tts

    tts = create_tts("espeak")
    pause = np.zeros(int(0.7 * 16000), np.float32)
    parts = []
    for text in ("The bridge reopened today.", "Traffic is moving again.", "More at nine."):
        speech = tts.synthesize(text)
        parts += [speech.pcm.astype(np.float32), pause]
    return np.concatenate(parts)


@pytest.mark.slow
def test_a_live_session_blinks_at_phrase_ends_and_draws_the_lids(small_avatar, phrased_speech) -> None:
    import asyncio

    from lipstream.engines.registry import create_engine
    from lipstream.render.frames import AvatarFrame
    from lipstream.render.session import RenderSession, SessionConfig, SessionEvent
    from lipstream.server.protocol import Flags, decode_media, frame_messages

    assert small_avatar.manifest.drawn_blink_starts() is not None  # the sample never blinks by itself
    config = SessionConfig(encode=False, phrase_blinks=PhraseBlinkConfig(chance=1.0, gap_s=0.5))

    async def run() -> list[AvatarFrame]:
        frames: list[AvatarFrame] = []
        async with RenderSession(small_avatar, create_engine("viseme"), config) as session:
            session.push_audio(phrased_speech)
            session.flush()
            async for item in session:
                if isinstance(item, AvatarFrame):
                    frames.append(item)
                elif isinstance(item, SessionEvent) and item.type == "playback_finished":
                    break
            for _ in range(10):  # the last pause is confirmed after the utterance: idle frames blink too
                frames.append(await session.__aiter__().__anext__())
        return frames

    frames = asyncio.run(run())
    starts = [f.index for f in frames if f.blink_starts]
    assert len(starts) == 3, starts  # one per phrase end (the third confirmed after the speech)
    speaking = np.array([f.speaking for f in frames])
    # each starts in a pause: 0.2 s after the last voiced frame, which is inside the utterance
    for k in starts[:2]:
        assert speaking[[f.index for f in frames].index(k)]
    from lipstream.render.compositor import Compositor

    compositor = Compositor(small_avatar)
    for f in frames:
        rect = compositor.lids.rect(f.base_index)
        x0, y0, x1, y1 = rect
        plain = compositor.compose(f.base_index, None)[y0:y1, x0:x1]
        differs = not np.array_equal(f.image[y0:y1, x0:x1], plain)
        assert differs == (f.lids > 0.05), (f.index, f.lids)
    # the patch stream tells its client where each starts (flag bit 3, video only)
    f = next(f for f in frames if f.blink_starts)
    f.access_unit = b""
    video, audio = frame_messages(f, patch=True)
    assert decode_media(video).flags & Flags.BLINK and not decode_media(audio).flags & Flags.BLINK

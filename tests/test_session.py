"""The in-process streaming Session: audio clock, events, interrupt, several sessions on one engine."""

from __future__ import annotations

import asyncio

import av
import numpy as np
import pytest

from lipstream.audio.decode import to_int16
from lipstream.audio.timeline import SAMPLES_PER_FRAME
from lipstream.engines.registry import create_engine
from lipstream.render.frames import AvatarFrame
from lipstream.render.session import SessionConfig, SessionEvent
from lipstream.session import Session


@pytest.fixture(scope="module")
def engine():
    return create_engine("viseme")


@pytest.fixture(scope="module")
def speech():
    from lipstream.talk.voices.tts import create_tts

    return create_tts("espeak").synthesize("Good evening, the bridge reopened today.")


async def _collect(session: Session, until, limit: int = 2000) -> list:
    items = []
    async for item in session:
        items.append(item)
        if until(item) or len(items) >= limit:
            break
    return items


def _finished(item) -> bool:
    return isinstance(item, SessionEvent) and item.type == "playback_finished"


def test_pushed_audio_plays_on_the_audio_clock(small_avatar, engine, speech) -> None:
    async def run():
        engine.prepare(small_avatar)
        async with Session(small_avatar, engine, SessionConfig(encode=True)) as session:
            pcm16 = to_int16(speech.pcm)
            for start in range(0, len(pcm16), 1000):  # odd-sized chunks, like a live TTS
                session.push_audio(pcm16[start : start + 1000], 16000)
            session.flush()
            return await _collect(session, _finished), session.codec_string, dict(session.stats.as_dict())

    items, codec, stats = asyncio.run(run())
    frames = [i for i in items if isinstance(i, AvatarFrame)]
    assert [f.pts for f in frames] == [k * SAMPLES_PER_FRAME for k in range(len(frames))]
    assert all(len(f.audio) == SAMPLES_PER_FRAME and f.access_unit for f in frames)
    assert frames[0].keyframe and codec.startswith("avc1.42")
    started = next(i for i, x in enumerate(items) if getattr(x, "type", "") == "speech_started")
    first_speech = next(i for i, x in enumerate(items) if isinstance(x, AvatarFrame) and x.speaking)
    assert started < first_speech
    speaking = [f for f in frames if f.speaking]
    assert len(speaking) == -(-len(speech.pcm) // SAMPLES_PER_FRAME)
    assert speaking[-1].end_of_speech and sum(f.end_of_speech for f in frames) == 1
    assert items[started].position_samples == speaking[0].pts
    assert items[-1].position_samples == speaking[-1].pts + SAMPLES_PER_FRAME and not items[-1].interrupted
    # the audio slices, end to end, are the pushed audio (as int16), padded to a whole frame
    heard = np.concatenate([f.audio for f in speaking])
    sent = to_int16(speech.pcm)
    assert np.array_equal(heard[: len(sent)], sent) and not heard[len(sent) :].any()
    # idle frames carry silence and the avatar's own frames
    assert all(not f.audio.any() for f in frames if not f.speaking)
    # every access unit decodes
    codec_ctx = av.CodecContext.create("h264", "r")
    decoded = sum(len(codec_ctx.decode(av.Packet(f.access_unit))) for f in frames)
    decoded += len(codec_ctx.decode(None))
    assert decoded == len(frames)
    assert stats["ttff_ms"] and stats["ttff_ms"][0] < 2000


def test_interrupt_stops_speech_and_resumes_ahead_of_playback(small_avatar, engine) -> None:
    from lipstream.talk.voices.tts import create_tts

    long_speech = create_tts("espeak").synthesize("This sentence is long enough to be cut off. " * 4)

    async def run():
        async with Session(small_avatar, engine, SessionConfig(encode=False)) as session:
            session.push_audio(long_speech.pcm, 16000)
            session.flush()
            before = await _collect(session, lambda i: getattr(i, "speaking", False) and i.index > 10)
            session.interrupt()
            after = await _collect(session, lambda i: isinstance(i, AvatarFrame) and i.index > 60, limit=500)
            return before, after

    before, after = asyncio.run(run())
    event = next(i for i in after if isinstance(i, SessionEvent))
    assert event.type == "playback_finished" and event.interrupted
    assert after.index(event) == 0, "the event comes before any frame produced after the interrupt"
    later = [i for i in after if isinstance(i, AvatarFrame)]
    assert later and not any(f.speaking for f in later)
    assert later[0].pts == event.position_samples
    assert [f.pts for f in later] == [later[0].pts + k * SAMPLES_PER_FRAME for k in range(len(later))]
    last_before = max(f.pts for f in before if isinstance(f, AvatarFrame))
    assert event.position_samples <= last_before + SAMPLES_PER_FRAME


def test_idle_frames_are_the_avatar_itself(small_avatar, engine) -> None:
    async def run():
        async with Session(small_avatar, engine, SessionConfig(encode=False)) as session:
            return await _collect(session, lambda i: isinstance(i, AvatarFrame) and i.index >= 5)

    frames = asyncio.run(run())
    for f in frames:
        assert not f.speaking
        assert np.array_equal(f.image, small_avatar.frames[small_avatar.base_frame_index(f.index)])


def test_text_and_two_sessions_share_one_engine(small_avatar, engine) -> None:
    async def speak(text: str) -> list:
        async with Session(small_avatar, engine, SessionConfig(encode=True, voice="espeak")) as session:
            await session.push_text(text)
            return await _collect(session, _finished)

    async def both():
        return await asyncio.gather(speak("One session speaks."), speak("Another one speaks too, at once."))

    first, second = asyncio.run(both())
    for items in (first, second):
        frames = [i for i in items if isinstance(i, AvatarFrame)]
        assert sum(f.speaking for f in frames) > 15
        assert not items[-1].interrupted


def test_half_size_stream(small_avatar, engine) -> None:
    w, h = small_avatar.size

    async def run():
        config = SessionConfig(encode=True, output_width=w // 2)
        async with Session(small_avatar, engine, config) as session:
            frames = await _collect(session, lambda i: isinstance(i, AvatarFrame) and i.index >= 3)
            return frames, session.width, session.height

    frames, sw, sh = asyncio.run(run())
    assert (sw, sh) == (w // 2, h // 2)
    codec_ctx = av.CodecContext.create("h264", "r")
    pictures = codec_ctx.decode(av.Packet(frames[0].access_unit))
    assert (pictures[0].width, pictures[0].height) == (w // 2, h // 2)


def test_first_frame_after_an_interrupt_is_an_idr(small_avatar, engine, speech) -> None:
    async def run():
        async with Session(small_avatar, engine, SessionConfig(encode=True)) as session:
            session.push_audio(speech.pcm, 16000)
            session.flush()
            await _collect(session, lambda i: getattr(i, "speaking", False) and i.index > 5)
            session.interrupt()
            return await _collect(session, lambda i: isinstance(i, AvatarFrame) and i.index > 20)

    after = asyncio.run(run())
    frames = [i for i in after if isinstance(i, AvatarFrame)]
    assert frames[0].keyframe and not any(f.keyframe for f in frames[1:])
    codec_ctx = av.CodecContext.create("h264", "r")
    decoded = sum(len(codec_ctx.decode(av.Packet(f.access_unit))) for f in frames)
    assert decoded + len(codec_ctx.decode(None)) == len(frames)  # a fresh decoder can start right there


def test_speech_batches_start_with_one_frame_and_grow_with_the_lead() -> None:
    from lipstream.render.speech_batches import speech_batch

    assert speech_batch(8, 3.0, emitted=0) == 1  # the first frame alone, however far ahead
    assert speech_batch(8, 3.0, emitted=1) == 1  # just after it: a batch made late would be heard late
    assert speech_batch(8, 6.5, emitted=2) == 3
    assert speech_batch(8, 25.0, emitted=5) == 8  # a second ahead: the engine's own batch
    assert speech_batch(4, 0.2, emitted=1) == 1  # behind at the start: one at a time, never none
    assert speech_batch(8, 0.5, emitted=16) == 8  # later, an engine behind keeps its whole batches

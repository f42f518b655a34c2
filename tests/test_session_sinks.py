"""Streams out: a session's frames through each sink, and speech handed in as a sentence stream."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from lipstream.audio.timeline import SAMPLES_PER_FRAME
from lipstream.engines.registry import create_engine
from lipstream.render.frames import AvatarFrame
from lipstream.render.mp4_sink import Mp4Recording
from lipstream.render.session import RenderSession, SessionConfig, SessionEvent


@pytest.fixture(scope="module")
def engine():
    return create_engine("viseme")


@pytest.fixture(scope="module")
def sentences():
    from lipstream.talk.voices.tts import create_tts

    tts = create_tts("espeak")
    return list(tts.synthesize_sentences("Good evening. The bridge reopened today."))


async def _speak_and_collect(session: RenderSession, speeches) -> list:
    async def stream():
        for speech in speeches:
            yield speech

    await session.push_speech_stream(stream())
    items = []
    async for item in session:
        items.append(item)
        if isinstance(item, SessionEvent) and item.type == "playback_finished":
            return items
    return items


def _probe(path: Path) -> dict:
    out = subprocess.run(
        ["ffprobe", "-v", "error", "-count_frames", "-show_streams", "-of", "json", str(path)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {s["codec_type"]: s for s in json.loads(out.stdout)["streams"]}


def test_a_recording_sink_writes_what_was_played(small_avatar, engine, sentences, tmp_path) -> None:
    """Mp4Recording: the consumer gets raw pictures, the file holds exactly those frames and their audio."""
    target = tmp_path / "live.mp4"

    async def run():
        sink = Mp4Recording(target)
        async with RenderSession(small_avatar, engine, SessionConfig(encode=False), sink=sink) as session:
            items = await _speak_and_collect(session, sentences)
        return items, sink.frames_written

    items, written = asyncio.run(run())
    frames = [i for i in items if isinstance(i, AvatarFrame)]
    assert all(f.image is not None and f.access_unit is None for f in frames)
    texts = [i.message for i in items if isinstance(i, SessionEvent) and i.type == "text"]
    assert texts == [s.text for s in sentences]  # each sentence's text at its first frame
    assert sum(f.speaking for f in frames) > 15
    streams = _probe(target)
    assert int(streams["video"]["nb_read_frames"]) == written >= len(frames)
    video_s = written / 25
    assert abs(float(streams["audio"]["duration"]) - video_s) < 0.1, (streams["audio"]["duration"], video_s)
    assert not list(tmp_path.glob(".*"))  # no temporary file left beside it


def test_raw_sessions_encode_nothing_and_patch_sessions_only_the_mouth(small_avatar, engine, sentences):
    """The sink follows the consumer: raw RGB without an encoder; the patch stream encodes the mouth only,
    and nothing while the mouth rests."""

    async def run(config: SessionConfig):
        async with RenderSession(small_avatar, engine, config) as session:
            items = await _speak_and_collect(session, sentences[:1])
            return items, session.codec_string, session.patch_rect

    raw, codec, _ = asyncio.run(run(SessionConfig(encode=False)))
    assert codec == ""
    raw_frames = [i for i in raw if isinstance(i, AvatarFrame)]
    assert all(isinstance(f.image, np.ndarray) and f.access_unit is None for f in raw_frames)

    patch, codec, rect = asyncio.run(run(SessionConfig(encode=True, stream="patch")))
    frames = [i for i in patch if isinstance(i, AvatarFrame)]
    assert codec.startswith("avc1.") and rect is not None
    assert all(f.image is None for f in frames)
    assert any(f.access_unit for f in frames if f.speaking)
    assert all(f.access_unit == b"" for f in frames if not f.speaking)  # resting mouth: nothing encoded
    assert [f.pts for f in frames] == [k * SAMPLES_PER_FRAME for k in range(len(frames))]


def test_a_recording_that_cannot_be_written_says_so(small_avatar, engine, tmp_path) -> None:
    """A target in a missing folder fails at start, naming it; nothing is created."""
    from lipstream.errors import MediaError

    async def run():
        sink = Mp4Recording(tmp_path / "missing" / "live.mp4")
        async with RenderSession(small_avatar, engine, SessionConfig(encode=False), sink=sink):
            pass

    with pytest.raises(MediaError, match="missing"):
        asyncio.run(run())
    assert not (tmp_path / "missing").exists()

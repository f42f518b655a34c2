"""LipstreamVideoGenerator with real livekit-agents 1.8.9 / livekit 1.1.21 objects, no LiveKit server.

- the generator alone, fed espeak-ng speech as 24 kHz `rtc.AudioFrame`s in 100 ms frames (what the data
  stream receiver hands the runner): real `rtc.VideoFrame`s, audio back sample for sample, one video frame
  per 40 ms of it, `AudioSegmentEnd` after each segment, video-only idle frames between segments,
  `clear_buffer` mid-segment;
- livekit's own `AvatarRunner` around it, with real `rtc.AudioSource`/`rtc.VideoSource` and its
  `rtc.AVSynchronizer`, fed by `QueueAudioOutput` (the in-process twin of the data stream: the agent's
  AudioOutput on one side, the runner's AudioReceiver on the other). The runner's only room call,
  publishing its two tracks, is skipped (`RoomlessRunner`): there is no server to publish to. What the
  runner takes from the generator is timed (`Seen`) against playback_started/finished, which AgentSession
  turns into its `speaking` state, and against the generator's own `agent_state`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("livekit.agents")

from livekit import rtc  # noqa: E402
from livekit.agents.voice.avatar import (  # noqa: E402
    AudioSegmentEnd,
    AvatarRunner,
    QueueAudioOutput,
    VideoGenerator,
)
from livekit.agents.voice.io import PlaybackFinishedEvent  # noqa: E402

from lipstream.avatar.bundle import load_avatar  # noqa: E402
from lipstream.engines.viseme.edges import EdgeConfig  # noqa: E402
from lipstream.errors import LipstreamError  # noqa: E402
from lipstream.integrations.livekit import LipstreamVideoGenerator  # noqa: E402
from tests.livekit_fixtures import FRAME_SAMPLES, RATE, prepared_avatar, speech_24k  # noqa: E402

# a real LiveKit AvatarRunner and its queues, 1.5-7.5 s a test: the full tier
pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]
CHUNK = RATE // 10  # DataStreamAudioReceiver's default frame: 100 ms


@pytest.fixture(scope="module")
def avatar_path(request: pytest.FixtureRequest) -> Path:
    """The small prepared avatar (see livekit_fixtures.prepared_avatar)."""
    return prepared_avatar(request)


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """~5 s of espeak-ng speech, 24 kHz int16 mono."""
    return speech_24k(tmp_path_factory)


def audio_frames(pcm: np.ndarray, chunk: int = CHUNK) -> list[rtc.AudioFrame]:
    """`pcm` as the receiver hands it over: fixed-size frames, a shorter last one."""
    return [
        rtc.AudioFrame(pcm[i : i + chunk].tobytes(), RATE, 1, len(pcm[i : i + chunk]))
        for i in range(0, len(pcm), chunk)
    ]


def pcm_of(frames: list[rtc.AudioFrame]) -> np.ndarray:
    """The int16 samples of audio frames, joined."""
    if not frames:
        return np.zeros(0, np.int16)
    return np.concatenate([np.frombuffer(f.data, dtype=np.int16) for f in frames])


class Collector:
    """Iterates a generator in the background, recording what it yields with the time it came."""

    def __init__(self, generator: LipstreamVideoGenerator) -> None:
        self.items: list[tuple[float, object]] = []
        self._task = asyncio.create_task(self._run(generator))

    async def _run(self, generator: LipstreamVideoGenerator) -> None:
        async for item in generator:
            self.items.append((time.perf_counter(), item))

    async def wait_for(self, condition, timeout: float = 20.0) -> None:
        """Poll `condition()` until it holds."""
        deadline = time.perf_counter() + timeout
        while not condition():
            assert time.perf_counter() < deadline, "timed out waiting for the generator"
            await asyncio.sleep(0.01)

    def count(self, kind: type) -> int:
        """How many items of `kind` came so far."""
        return sum(isinstance(item, kind) for _, item in self.items)

    async def stop(self) -> None:
        """Stop iterating."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def end_segment(self, generator: LipstreamVideoGenerator) -> list[object]:
        """Close the pushed segment, wait for its AudioSegmentEnd, stop, close the generator; what came."""
        await generator.push_audio(AudioSegmentEnd())
        await self.wait_for(lambda: self.count(AudioSegmentEnd) == 1, 15)
        await self.stop()
        await generator.aclose()
        return [item for _, item in self.items]


def segments(items: list[object]) -> list[list[object]]:
    """The yielded items split after each AudioSegmentEnd (the tail, if any, is the last list)."""
    out: list[list[object]] = [[]]
    for item in items:
        out[-1].append(item)
        if isinstance(item, AudioSegmentEnd):
            out.append([])
    return out


@pytest.mark.slow
def test_two_segments_sample_exact_with_idle_between(avatar_path: Path, speech: np.ndarray) -> None:
    """Two replies in a row: each comes back sample for sample at 24 kHz, one video frame per 960 samples,
    each followed by its AudioSegmentEnd; before, between and after them the presenter idles in video."""
    bundle = load_avatar(avatar_path)
    first, second = speech, speech[: RATE * 2 + 123]  # the second ends mid-frame on purpose

    async def main() -> Collector:
        generator = LipstreamVideoGenerator(avatar_path, video_format="rgb24")  # pictures to compare
        await generator.start()
        assert (generator.width, generator.height) == bundle.size
        collector = Collector(generator)
        await collector.wait_for(lambda: collector.count(rtc.VideoFrame) >= 10)  # idle from the start
        for pcm in (first, second):
            for frame in audio_frames(pcm):
                await generator.push_audio(frame)  # faster than real time, as TTS delivers it
            await generator.push_audio(AudioSegmentEnd())
            ends = collector.count(AudioSegmentEnd)
            await collector.wait_for(lambda n=ends: collector.count(AudioSegmentEnd) > n, 15)
            # the Session runs up to 1 s ahead while speaking; idle frames follow once the clock is there
            videos = collector.count(rtc.VideoFrame)
            await collector.wait_for(lambda n=videos: collector.count(rtc.VideoFrame) >= n + 10)
        await collector.stop()
        await generator.aclose()
        return collector

    collector = asyncio.run(main())
    items = [item for _, item in collector.items]
    pieces = segments(items)
    assert len(pieces) == 3, [len(p) for p in pieces]
    one, two, after = pieces
    for piece, pcm in ((one, first), (two, second)):
        assert isinstance(piece[-1], AudioSegmentEnd)
        audio = [x for x in piece if isinstance(x, rtc.AudioFrame)]
        np.testing.assert_array_equal(pcm_of(audio), pcm)  # sample-exact, nothing added or lost
        assert {a.sample_rate for a in audio} == {RATE} and {a.num_channels for a in audio} == {1}
        # 25 fps on the audio clock: 960 samples per video frame, only the segment's last one shorter
        assert [a.samples_per_channel for a in audio[:-1]] == [FRAME_SAMPLES] * (len(audio) - 1)
        assert 0 < audio[-1].samples_per_channel <= FRAME_SAMPLES
        assert len(audio) == -(-len(pcm) // FRAME_SAMPLES)
        # each audio frame comes right after its own video frame
        for i, item in enumerate(piece):
            if isinstance(item, rtc.AudioFrame):
                assert isinstance(piece[i - 1], rtc.VideoFrame)
        # idle before the speech: video frames with no audio
        leading = next(i for i, x in enumerate(piece) if isinstance(x, rtc.AudioFrame))
        assert leading >= 2 and all(isinstance(x, rtc.VideoFrame) for x in piece[: leading - 1])
    assert len(after) >= 10 and all(isinstance(x, rtc.VideoFrame) for x in after)  # idles after
    for video in (x for x in items if isinstance(x, rtc.VideoFrame)):
        assert video.type == rtc.VideoBufferType.RGB24 and (video.width, video.height) == bundle.size
        assert len(video.data) == video.width * video.height * 3

    # the mouth moves while speaking and is the presenter's own while idle, after the few frames that ease
    # it back (head motion aside: each picture is compared with the avatar frame it was made from, found by
    # its likeness outside the face)
    speaking = [x for i, x in enumerate(one[:-1]) if isinstance(one[i + 1], rtc.AudioFrame)]
    idle = [x for x in after if isinstance(x, rtc.VideoFrame)]
    base = [np.asarray(bundle.frames[i]).astype(np.int16) for i in range(len(bundle.boxes))]
    speaking_change = [mouth_change(base, bundle.boxes, frame) for frame in speaking]
    idle_change = [mouth_change(base, bundle.boxes, frame) for frame in idle]
    assert np.median(speaking_change) > 2.0 and np.std(speaking_change) > 0.5, np.median(speaking_change)
    easing = EdgeConfig().frames
    eased = idle_change[: easing + 1]
    assert all(a > b for a, b in zip(eased, eased[1:], strict=False)), idle_change
    assert max(idle_change[easing:]) < 0.5, idle_change


def mouth_change(base: list[np.ndarray], boxes: np.ndarray, frame: rtc.VideoFrame) -> float:
    """Mean absolute difference from the avatar's own frame (`base`) in the lower half of the face box."""
    picture = np.frombuffer(frame.data, np.uint8).reshape(frame.height, frame.width, 3).astype(np.int16)
    nearest = int(np.argmin([np.abs(b[::8, ::8] - picture[::8, ::8]).mean() for b in base]))
    x1, y1, x2, y2 = (int(v) for v in boxes[nearest])
    lower = slice((y1 + y2) // 2, y2), slice(x1, x2)
    return float(np.abs(picture[lower] - base[nearest][lower]).mean())


def test_clear_buffer_mid_segment_stops_at_once(avatar_path: Path, speech: np.ndarray) -> None:
    """clear_buffer 1 s into a reply: no audio after it, the AudioSegmentEnd follows, the presenter idles,
    and the next reply plays whole."""
    state: dict[str, float] = {}

    async def main() -> Collector:
        generator = LipstreamVideoGenerator(avatar_path)
        collector = Collector(generator)
        await collector.wait_for(lambda: collector.count(rtc.VideoFrame) >= 5)
        for frame in audio_frames(speech):
            await generator.push_audio(frame)
        await generator.push_audio(AudioSegmentEnd())
        await collector.wait_for(lambda: collector.count(rtc.AudioFrame) >= 25)  # ~1 s out
        state["cleared_at"] = len(collector.items)
        await generator.clear_buffer()  # returns once the collector has taken its next item
        await collector.wait_for(lambda: collector.count(AudioSegmentEnd) == 1, 5)
        await asyncio.sleep(0.6)
        state["second_from"] = len(collector.items)
        short = speech[: RATE + 500]
        for frame in audio_frames(short):
            await generator.push_audio(frame)
        await generator.push_audio(AudioSegmentEnd())
        await collector.wait_for(lambda: collector.count(AudioSegmentEnd) == 2, 10)
        await collector.stop()
        await generator.aclose()
        return collector

    collector = asyncio.run(main())
    items = [item for _, item in collector.items]
    for video in (x for x in items if isinstance(x, rtc.VideoFrame)):  # the default: WebRTC's I420
        assert (
            video.type == rtc.VideoBufferType.I420 and len(video.data) == video.width * video.height * 3 // 2
        )
    cut, second_from = int(state["cleared_at"]), int(state["second_from"])
    played = pcm_of([x for x in items[:cut] if isinstance(x, rtc.AudioFrame)])
    np.testing.assert_array_equal(played, speech[: len(played)])  # what played is the reply's start
    after_clear = items[cut:second_from]
    assert not any(isinstance(x, rtc.AudioFrame) for x in after_clear)  # no audio after clear_buffer
    end = next(i for i, x in enumerate(after_clear) if isinstance(x, AudioSegmentEnd))
    assert end == 0  # at once: the next item the runner gets
    assert sum(isinstance(x, rtc.VideoFrame) for x in after_clear[end:]) >= 10  # idles on
    second = [x for x in items[second_from:] if isinstance(x, rtc.AudioFrame)]
    np.testing.assert_array_equal(pcm_of(second), speech[: RATE + 500])
    assert isinstance(items[-1], AudioSegmentEnd)


class RoomlessRunner(AvatarRunner):
    """livekit's AvatarRunner with its one room call, publishing the tracks, left out (no server)."""

    async def _publish_track(self) -> None:
        """No room to publish to: the synchroniser's sources are real, only the tracks are not made."""


class Seen(VideoGenerator):
    """A generator as the runner sees it: each item it yields, with the time the runner took it."""

    def __init__(self, generator: LipstreamVideoGenerator) -> None:
        self.generator = generator
        self.items: list[tuple[float, object]] = []

    async def push_audio(self, frame: rtc.AudioFrame | AudioSegmentEnd) -> None:
        """Pass it on."""
        await self.generator.push_audio(frame)

    def clear_buffer(self) -> Coroutine[Any, Any, None]:
        """Pass it on (the runner awaits what it returns)."""
        return self.generator.clear_buffer()

    def __aiter__(self) -> AsyncIterator[rtc.VideoFrame | rtc.AudioFrame | AudioSegmentEnd]:
        return self._items()

    async def _items(self) -> AsyncIterator[rtc.VideoFrame | rtc.AudioFrame | AudioSegmentEnd]:
        async for item in self.generator:
            self.items.append((time.perf_counter(), item))
            yield item


def test_avatar_runner_with_queue_io_and_av_synchronizer(avatar_path: Path, speech: np.ndarray) -> None:
    """The agent's AudioOutput -> AvatarRunner -> generator -> AVSynchronizer (real AudioSource and
    VideoSource), in one process: playback events come back to the agent with the exact played duration,
    and an interruption reports where it stopped. playback_started (what AgentSession turns into its
    `speaking` state) comes as the runner takes the first speaking frame, never while the face idles,
    playback_finished as it takes the last one, and at once on the interruption; `agent_state` follows."""
    reply = speech[: RATE * 2]
    events: list[tuple[str, object, float]] = []
    states: list[tuple[float, str]] = []
    marks: dict[str, float] = {}

    async def main() -> tuple[Seen, float]:
        on_state = lambda state: states.append((time.perf_counter(), state))  # noqa: E731
        generator = LipstreamVideoGenerator(avatar_path, on_state=on_state)
        await generator.start()
        io = QueueAudioOutput(sample_rate=RATE, wait_playback_start=True)  # the agent's AudioOutput
        io.on("playback_started", lambda ev: events.append(("started", ev, time.perf_counter())))
        io.on("playback_finished", lambda ev: events.append(("finished", ev, time.perf_counter())))
        seen = Seen(generator)
        options = generator.avatar_options(RATE)
        runner = RoomlessRunner(rtc.Room(), audio_recv=io, video_gen=seen, options=options)
        await runner.start()
        await asyncio.sleep(0.5)  # the face idles first
        started = time.perf_counter()
        for frame in audio_frames(reply):
            await io.capture_frame(frame)
        io.flush()
        finished = await asyncio.wait_for(io.wait_for_playout(), len(reply) / RATE + 10)
        elapsed = time.perf_counter() - started
        await asyncio.sleep(0.3)  # idle between the replies
        # a second reply, interrupted 0.8 s in as AgentSession does on barge-in
        for frame in audio_frames(speech):
            await io.capture_frame(frame)
        io.flush()
        await asyncio.sleep(0.8)
        marks["clear"] = time.perf_counter()
        io.clear_buffer()
        await asyncio.wait_for(io.wait_for_playout(), 5)
        await asyncio.sleep(0.3)
        await runner.aclose()
        await generator.aclose()
        assert not finished.interrupted
        return seen, elapsed

    seen, elapsed = asyncio.run(main())
    kinds = [kind for kind, _, _ in events]
    assert kinds == ["started", "finished", "started", "finished"], kinds  # idle frames start nothing
    first: PlaybackFinishedEvent = events[1][1]
    assert not first.interrupted
    assert first.playback_position == pytest.approx(len(reply) / RATE, abs=1e-6)  # every sample, once
    # the synchroniser plays in real time: the reply took at least its own length to play out
    assert elapsed >= len(reply) / RATE - 0.1
    second: PlaybackFinishedEvent = events[3][1]
    assert second.interrupted
    # the position reported is what the synchroniser had been given when the agent cut in
    assert 0.2 < second.playback_position < 1.6, second.playback_position

    # when: each reply's first audio frame comes right after its picture, the first speaking frame's; the
    # runner says playback_started as it takes it, and playback_finished as it takes the AudioSegmentEnd
    # that follows the last (items before the first reply: video only, ~0.5 s of idle)
    items = seen.items
    audio_at = [i for i, (_, x) in enumerate(items) if isinstance(x, rtc.AudioFrame)]
    firsts = [i for i in audio_at if not isinstance(items[i - 2][1], rtc.AudioFrame)]
    assert len(firsts) == 2 and firsts[0] >= 10 and isinstance(items[firsts[0] - 1][1], rtc.VideoFrame)
    ends = [i for i, (_, x) in enumerate(items) if isinstance(x, AudioSegmentEnd)]
    # (bounds in wall time allow for a loaded machine: the runner's push waits on the AudioSource's
    # real-time queue, and a busy event loop runs the reporting task late; CI once saw 110 ms)
    for (_, _, t_started), first_audio in zip(events[::2], firsts, strict=True):
        assert 0 <= t_started - items[first_audio][0] < 0.25  # the same frame: taken, pushed, reported
        assert 0 <= t_started - items[first_audio - 1][0] < 0.3  # right after its picture
        later = [t for t, _ in items[first_audio + 1 :]]
        assert not later or t_started <= later[0] + 0.05  # before the runner went on to the next item
    last_audio = max(i for i in audio_at if i < ends[0])
    assert ends[0] == last_audio + 1 and 0 <= events[1][2] - items[ends[0]][0] < 0.1
    assert events[1][2] - items[last_audio][0] < 0.3
    assert 0 <= events[3][2] - marks["clear"] < 0.15  # the cut: at once
    assert not any(isinstance(x, rtc.AudioFrame) for t, x in items if t > marks["clear"])
    # agent_state: speaking and listening at those same moments
    assert [state for _, state in states] == ["speaking", "listening"] * 2
    assert all(abs(t - e[2]) < 0.05 for (t, _), e in zip(states, events, strict=True)), (states, events)


def test_an_audio_push_in_flight_at_the_cut_starts_no_playback(avatar_path: Path, speech: np.ndarray) -> None:
    """The agent cuts in while the runner is still inside an audio frame's push (a loaded AudioSource's
    real-time queue): the interrupted playback_finished follows once that push is done, and no
    playback_started comes after it. The runner zeroes its playback position at the cut, so a push still
    in flight then would count as a new segment's start (a flake of the test above under load)."""
    events: list[str] = []

    async def main() -> None:
        generator = LipstreamVideoGenerator(avatar_path)
        await generator.start()
        io = QueueAudioOutput(sample_rate=RATE, wait_playback_start=True)
        io.on("playback_started", lambda _: events.append("started"))
        io.on("playback_finished", lambda ev: events.append("finished" + " interrupted" * ev.interrupted))
        runner = RoomlessRunner(rtc.Room(), audio_recv=io, video_gen=generator,
                                options=generator.avatar_options(RATE))  # fmt: skip
        await runner.start()
        holding, in_push, cut = [False], asyncio.Event(), asyncio.Event()
        push = runner.av_sync.push

        async def push_held_at_the_cut(frame: rtc.VideoFrame | rtc.AudioFrame) -> None:
            if holding[0] and isinstance(frame, rtc.AudioFrame):
                holding[0] = False
                in_push.set()
                await cut.wait()
                await asyncio.sleep(0.05)  # the runner's cut handler runs while this push is in flight
            await push(frame)

        runner.av_sync.push = push_held_at_the_cut  # type: ignore[method-assign]
        for frame in audio_frames(speech):
            await io.capture_frame(frame)
        io.flush()
        await asyncio.sleep(0.8)
        holding[0] = True
        await asyncio.wait_for(in_push.wait(), 2)
        io.clear_buffer()
        cut.set()
        await asyncio.wait_for(io.wait_for_playout(), 5)
        await asyncio.sleep(0.5)  # a late playback_started would come in here
        await runner.aclose()
        await generator.aclose()

    asyncio.run(main())
    assert events == ["started", "finished interrupted"], events


def test_bad_arguments_are_refused_clearly(avatar_path: Path) -> None:
    """Another frame rate or an unknown avatar is a LipstreamError saying what to do."""
    with pytest.raises(LipstreamError, match="25 fps"):
        LipstreamVideoGenerator(avatar_path, fps=30)
    with pytest.raises(LipstreamError, match="unknown avatar 'nobody'"):
        LipstreamVideoGenerator("nobody")


def test_stereo_at_another_rate_comes_back_as_pushed(avatar_path: Path, speech: np.ndarray) -> None:
    """Interleaved stereo at 44.1 kHz (1764 samples a frame): the same two channels come back, sample for
    sample, at 44.1 kHz."""
    from lipstream.audio.decode import resample, to_int16

    rate = 44_100
    left = to_int16(resample(speech[: RATE * 2], RATE, rate))
    stereo = np.stack([left, (left // 2).astype(np.int16)], axis=1)  # two different channels

    async def main() -> list[object]:
        generator = LipstreamVideoGenerator(avatar_path)
        collector = Collector(generator)
        chunk = rate // 10
        for start in range(0, len(stereo), chunk):
            block = stereo[start : start + chunk]
            await generator.push_audio(rtc.AudioFrame(block.tobytes(), rate, 2, len(block)))
        return await collector.end_segment(generator)

    items = asyncio.run(main())
    audio = [x for x in items if isinstance(x, rtc.AudioFrame)]
    assert {(a.sample_rate, a.num_channels) for a in audio} == {(rate, 2)}
    assert [a.samples_per_channel for a in audio[:-1]] == [rate // 25] * (len(audio) - 1)
    np.testing.assert_array_equal(pcm_of(audio).reshape(-1, 2), stereo)


def test_a_format_change_inside_a_segment_is_dropped(
    avatar_path: Path, speech: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    """A 48 kHz frame inside a 24 kHz segment is dropped with a warning saying why; the segment's own audio
    still comes back exactly (the Session never heard the odd frame either)."""
    reply = speech[:RATE]
    odd = rtc.AudioFrame(np.zeros(4800, np.int16).tobytes(), 48_000, 1, 4800)

    async def main() -> list[object]:
        generator = LipstreamVideoGenerator(avatar_path)
        collector = Collector(generator)
        frames = audio_frames(reply)
        for frame in frames[:5]:
            await generator.push_audio(frame)
        await generator.push_audio(odd)
        for frame in frames[5:]:
            await generator.push_audio(frame)
        return await collector.end_segment(generator)

    items = asyncio.run(main())
    np.testing.assert_array_equal(pcm_of([x for x in items if isinstance(x, rtc.AudioFrame)]), reply)
    assert "audio changed from 24000 Hz x1 to 48000 Hz x1 inside one segment" in caplog.text


def test_scaled_stream(avatar_path: Path, speech: np.ndarray) -> None:
    """output_width=180: I420 frames at 180×320 (the loop's pictures built at start), audio still exact."""
    reply = speech[: RATE + 300]

    async def main() -> list[object]:
        generator = LipstreamVideoGenerator(avatar_path, output_width=180)
        await generator.start()
        assert (generator.width, generator.height) == (180, 320)
        collector = Collector(generator)
        for frame in audio_frames(reply):
            await generator.push_audio(frame)
        return await collector.end_segment(generator)

    items = asyncio.run(main())
    videos = [x for x in items if isinstance(x, rtc.VideoFrame)]
    assert {(v.type, v.width, v.height, len(v.data)) for v in videos} == {
        (rtc.VideoBufferType.I420, 180, 320, 180 * 320 * 3 // 2)
    }
    np.testing.assert_array_equal(pcm_of([x for x in items if isinstance(x, rtc.AudioFrame)]), reply)

"""LipstreamAvatar in a real in-process Pipecat pipeline (Pipeline + PipelineWorker + WorkerRunner, the
names Pipecat 1.3+ gives PipelineTask and PipelineRunner).

Runs in the one environment (issue 24: pipecat-ai beside the runtime; mediapipe only in the face tracker's
own environment). The avatar it plays is prepared by a child process (tests/pipecat/make_avatar.py), so this
process plays it without ever loading the face tracker. Set LIPSTREAM_PIPECAT_AVATAR to a prepared bundle
folder to skip that step, or LIPSTREAM_PREPARE_PYTHON to the interpreter that prepares it (default: this one).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import subprocess
import sys
import time
import wave
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import pytest

pytest.importorskip("pipecat.frames.frames")

from pipecat.frames.frames import (  # noqa: E402
    CancelFrame,
    EndFrame,
    ErrorFrame,
    Frame,
    InterruptionFrame,
    OutputAudioRawFrame,
    OutputImageRawFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
)
from pipecat.pipeline.pipeline import Pipeline  # noqa: E402
from pipecat.pipeline.worker import PipelineWorker  # noqa: E402
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor  # noqa: E402
from pipecat.workers.runner import WorkerRunner  # noqa: E402

from lipstream.avatar.bundle import AvatarBundle, load_avatar  # noqa: E402
from lipstream.engines.viseme.edges import EdgeConfig  # noqa: E402
from lipstream.integrations.pipecat import LipstreamAvatar  # noqa: E402
from tests.pipecat.paced_output import PacedOutput, Watcher, play, until  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RATE = 16_000
SPF = 640  # samples per 40 ms frame at 16 kHz: 25 fps
TTS_CHUNK = 1024  # TTS chunk size at the TTS rate (not a multiple of a frame on purpose)
TEXT = "Good evening. Here is the news, read by a face that was never filmed saying it."

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]  # a Pipecat pipeline over a real session


# ----- inputs ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def avatar_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small prepared avatar (2 s, 360×640) with its viseme caches, made by a child process."""
    given = os.environ.get("LIPSTREAM_PIPECAT_AVATAR")
    if given:
        return Path(given)
    python = Path(os.environ.get("LIPSTREAM_PREPARE_PYTHON", sys.executable))
    root = tmp_path_factory.mktemp("pipecat_avatars")
    done = subprocess.run(
        [str(python), str(Path(__file__).with_name("make_avatar.py")), str(root)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def bundle(avatar_path: Path) -> AvatarBundle:
    """The prepared avatar, read here (reading needs no face tracking)."""
    return load_avatar(avatar_path)


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, int]:
    """TEXT spoken by espeak-ng at its native 22.05 kHz: (int16 mono, rate)."""
    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (make setup installs it)")
    path = tmp_path_factory.mktemp("speech") / "news.wav"
    subprocess.run(["espeak-ng", "-w", str(path), TEXT], check=True, timeout=60)
    with wave.open(str(path)) as wav:
        assert wav.getnchannels() == 1 and wav.getsampwidth() == 2
        return np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16), wav.getframerate()


# ----- the pipeline's ends ---------------------------------------------------------------------------------


class ScriptedTTS(FrameProcessor):
    """Stands where a TTS service stands: pushes TTSStarted, chunked TTSAudioRaw and TTSStopped frames."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Pass everything on."""
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)

    async def speak(self, pcm: np.ndarray, rate: int) -> None:
        """One TTS response, faster than real time as TTS services deliver it."""
        await self.push_frame(TTSStartedFrame())
        for start in range(0, len(pcm), TTS_CHUNK):
            chunk = pcm[start : start + TTS_CHUNK].tobytes()
            await self.push_frame(TTSAudioRawFrame(audio=chunk, sample_rate=rate, num_channels=1))
        await self.push_frame(TTSStoppedFrame())

    async def barge_in(self) -> None:
        """What a user-turn processor does when the user talks over the bot."""
        await self.broadcast_interruption()


class Recorder(FrameProcessor):
    """Plays the output transport's part: records every frame with its arrival time."""

    def __init__(self) -> None:
        super().__init__()
        self.items: list[tuple[float, Frame]] = []
        self.changed = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Record downstream frames, pass everything on."""
        await super().process_frame(frame, direction)
        if direction == FrameDirection.DOWNSTREAM:
            self.items.append((time.perf_counter(), frame))
            self.changed.set()
        await self.push_frame(frame, direction)

    async def wait_for(self, condition: Callable[[], bool], timeout: float = 20.0) -> None:
        """Wait until `condition()` holds (checked whenever a frame arrives)."""
        deadline = time.perf_counter() + timeout
        while not condition():
            left = deadline - time.perf_counter()
            assert left > 0, "timed out waiting for the pipeline"
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except asyncio.TimeoutError:
                pass

    def images(self) -> list[tuple[float, OutputImageRawFrame]]:
        """Recorded video frames with their arrival times."""
        return [(t, f) for t, f in self.items if isinstance(f, OutputImageRawFrame)]

    def first_time(self) -> float:
        """Arrival of the first video frame: the player's clock starts there."""
        return self.images()[0][0]


def info(frame: Frame) -> dict:
    """What lipstream says about a frame (pts in samples, speaking, ...)."""
    return frame.metadata["lipstream"]


def pairs(items: list[tuple[float, Frame]]) -> list[tuple[float, OutputImageRawFrame, OutputAudioRawFrame]]:
    """Each video frame with the audio frame right after it (asserts the two belong together)."""
    media = [(t, f) for t, f in items if isinstance(f, (OutputImageRawFrame, OutputAudioRawFrame))]
    out = []
    for (t, image), (_, audio) in zip(media[::2], media[1::2], strict=True):
        assert isinstance(image, OutputImageRawFrame) and type(image) is OutputImageRawFrame
        assert isinstance(audio, OutputAudioRawFrame) and not isinstance(audio, OutputImageRawFrame)
        assert info(image) is info(audio)
        out.append((t, image, audio))
    return out


async def run_pipeline(avatar: LipstreamAvatar, script: Callable, *, timeout: float = 60.0):
    """Run TTS -> avatar -> recorder with `script(worker, tts, recorder)` driving it; return the recorder
    and the errors the pipeline reported."""
    tts, recorder = ScriptedTTS(), Recorder()
    worker, errors = make_worker(tts, avatar, recorder)

    async def drive() -> None:
        await recorder.wait_for(lambda: len(recorder.images()) >= 5)  # idle frames flow from the start
        await script(worker, tts, recorder)

    await asyncio.wait_for(asyncio.gather(run_worker(worker), drive()), timeout)
    return recorder, errors


def make_worker(*processors: FrameProcessor) -> tuple[PipelineWorker, list[ErrorFrame]]:
    """A pipeline worker over `processors` and the list its reported errors go to."""
    worker = PipelineWorker(
        Pipeline(list(processors)), idle_timeout_secs=None, enable_rtvi=False, enable_turn_tracking=False
    )
    errors: list[ErrorFrame] = []

    @worker.event_handler("on_pipeline_error")
    async def on_error(_worker, frame: ErrorFrame) -> None:
        errors.append(frame)

    return worker, errors


async def run_worker(worker: PipelineWorker) -> None:
    """Run one worker to its end, as an application's main() does."""
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()


# ----- measures --------------------------------------------------------------------------------------------


def mouth_rect(bundle: AvatarBundle, base_index: int) -> tuple[int, int, int, int]:
    """Bounding rectangle (x0, y0, x1, y1) of the mouth blend mask in frame pixels."""
    x1, y1, x2, y2 = (int(v) for v in bundle.boxes[base_index])
    mask = np.asarray(bundle.masks[base_index])
    mask = cv2.resize(mask, (x2 - x1, y2 - y1), interpolation=cv2.INTER_NEAREST)
    ys, xs = np.nonzero(mask)
    return x1 + xs.min(), y1 + ys.min(), x1 + xs.max() + 1, y1 + ys.max() + 1


def mouth_change(bundle: AvatarBundle, image: OutputImageRawFrame) -> tuple[float, float]:
    """Mean absolute difference from the avatar's own frame: inside the mouth rectangle, and outside it."""
    width, height = image.size
    picture = np.frombuffer(image.image, dtype=np.uint8).reshape(height, width, 3).astype(np.int16)
    base_index = info(image)["base_index"]
    base = np.asarray(bundle.frames[base_index]).astype(np.int16)
    diff = np.abs(picture - base)
    x0, y0, x1, y1 = mouth_rect(bundle, base_index)
    inside = float(diff[y0:y1, x0:x1].mean())
    diff[y0:y1, x0:x1] = 0
    return inside, float(diff.sum()) / max(1, diff.size - (y1 - y0) * (x1 - x0) * 3)


def to_16k(pcm: np.ndarray, rate: int) -> np.ndarray:
    """Plain linear resampling as an independent reference (float, -1..1)."""
    x = pcm.astype(np.float32) / 32768.0
    n = int(round(len(x) * RATE / rate))
    return np.interp(np.arange(n) * rate / RATE, np.arange(len(x)), x).astype(np.float32)


def audio_of(frames: list[OutputAudioRawFrame]) -> np.ndarray:
    """Concatenated int16 audio of frames, as float."""
    pcm = np.concatenate([np.frombuffer(f.audio, dtype=np.int16) for f in frames])
    return pcm.astype(np.float32) / 32768.0


# ----- tests -----------------------------------------------------------------------------------------------


def test_speech_interruption_and_end(avatar_path: Path, bundle: AvatarBundle, speech) -> None:
    """One whole utterance, a second one interrupted mid-speech, idle after it, then EndFrame."""
    pcm, rate = speech
    state: dict[str, float] = {}
    avatar = LipstreamAvatar(avatar_path)

    async def script(worker: PipelineWorker, tts: ScriptedTTS, rec: Recorder) -> None:
        await tts.speak(pcm, rate)
        stopped = lambda: any(isinstance(f, TTSStoppedFrame) for _, f in rec.items)  # noqa: E731
        await rec.wait_for(stopped, timeout=len(pcm) / rate + 5)
        after_stop = len(rec.images())
        await rec.wait_for(lambda: len(rec.images()) >= after_stop + 12)  # the face idles in between
        state["second_from"] = len(rec.items)
        await tts.speak(pcm, rate)
        # interrupt once 0.8 s of the second utterance has played on the player's clock
        def played_into_second() -> float:
            speaking = [info(f)["pts"] for _, f in rec.images()[after_stop:] if info(f)["speaking"]]
            if not speaking:
                return 0.0
            return (time.perf_counter() - rec.first_time()) - speaking[0] / RATE

        await rec.wait_for(lambda: played_into_second() >= 0.8)
        while played_into_second() < 0.8:
            await asyncio.sleep(0.01)
        state["interrupt_at"] = time.perf_counter()
        await tts.barge_in()
        await asyncio.sleep(1.0)  # the stream goes on, idle
        await worker.queue_frame(EndFrame())

    recorder, errors = asyncio.run(run_pipeline(avatar, script))
    items = recorder.items
    assert not errors, [e.error for e in errors]
    assert avatar.session is None  # stopped at EndFrame
    assert isinstance(items[-1][1], EndFrame)

    cut = next(i for i, (_, f) in enumerate(items) if isinstance(f, InterruptionFrame))
    before, after = items[:cut], items[cut + 1 :]
    t0 = recorder.first_time()

    # video: RGB at the avatar's size, each picture followed by exactly its own 40 ms of 16 kHz audio
    played = pairs(before)
    for _, image, audio in played:
        assert image.format == "RGB" and image.size == bundle.size
        assert len(image.image) == bundle.size[0] * bundle.size[1] * 3
        assert audio.sample_rate == RATE and audio.num_channels == 1 and audio.num_frames == SPF
        assert image.pts == audio.pts == info(image)["pts"] * 62_500  # Pipecat pts: nanoseconds
        assert isinstance(audio, TTSAudioRawFrame) == info(image)["speaking"]
    # 25 fps on the audio clock: consecutive pts, delivered at the session's pace: never behind the player,
    # ahead by at most the session's 1 s lead plus one engine batch
    pts = np.array([info(image)["pts"] for _, image, _ in played])
    assert np.all(np.diff(pts) == SPF)
    lead = pts / RATE - (np.array([t for t, _, _ in played]) - t0)
    assert lead.min() > -0.25 and lead.max() < 1.5, (lead.min(), lead.max())

    # the whole first utterance came out: the input's length at 16 kHz, within a frame, and its sound
    first_uid = next(info(i)["utterance_id"] for _, i, _ in played if info(i)["speaking"])
    first = [(image, audio) for _, image, audio in played if info(image)["utterance_id"] == first_uid]
    expected = to_16k(pcm, rate)
    out = audio_of([audio for _, audio in first])
    assert abs(len(out) - len(expected)) < SPF, (len(out), len(expected))
    n = min(len(out), len(expected))
    assert np.corrcoef(out[:n], expected[:n])[0, 1] > 0.9  # in time with the input, not shifted
    assert info(first[-1][0])["end_of_speech"]
    # TTSStoppedFrame is forwarded right after the utterance's last frame, so the transport's
    # "bot stopped speaking" comes when the face stops, not when TTS finished synthesising
    stop_at = next(i for i, (_, f) in enumerate(before) if isinstance(f, TTSStoppedFrame))
    last_audio = next(i for i, (_, f) in enumerate(before) if f is first[-1][1])
    assert stop_at == last_audio + 1

    # mouth: moves while speaking, rests at the avatar's own closed mouth when idle; nothing else changes
    changes = {id(image): mouth_change(bundle, image) for _, image, _ in played}
    loud = [changes[id(image)][0] for image, audio in first
            if np.sqrt(np.mean(audio_of([audio]) ** 2)) > 0.05]
    # idle frames, but for the few after speech that ease the mouth back to the footage's own (nearer each)
    idle, easing, since_speech = [], [], EdgeConfig().frames
    for _, image, _ in played:
        if info(image)["speaking"]:
            if since_speech:
                easing.append([])
            since_speech = 0
        elif since_speech < EdgeConfig().frames:
            since_speech += 1
            easing[-1].append(changes[id(image)][0])
        else:
            idle.append(changes[id(image)][0])
    assert len(loud) > 20 and len(idle) > 10
    assert np.median(loud) > 3.0 and np.std(loud) > 1.0, (np.median(loud), np.std(loud))
    assert max(idle) < 0.5
    assert any(len(run) == EdgeConfig().frames for run in easing), easing
    assert all(a > b for run in easing for a, b in zip(run, run[1:], strict=False)), easing
    assert max(outside for _, outside in changes.values()) < 0.5

    # interruption: reaches the end of the pipeline at once, no speech after it, the stream resumes idle
    # within 150 ms of where the player was, frame after frame
    assert items[cut][0] - state["interrupt_at"] < 0.15
    resumed = pairs(after[:-1])
    assert len(resumed) >= 20  # ~1 s of idle frames
    assert not any(info(image)["speaking"] for _, image, _ in resumed)
    position = state["interrupt_at"] - t0
    resume = info(resumed[0][1])["pts"] / RATE
    assert -0.05 < resume - position < 0.15, resume - position
    assert np.all(np.diff([info(image)["pts"] for _, image, _ in resumed]) == SPF)
    second = [i for _, i, _ in pairs(items[state["second_from"] : cut]) if info(i)["speaking"]]
    assert len(second) >= 20  # it was interrupted mid-speech, after 0.8 s had played

    # the one environment holds no mediapipe: the face tracker lives in its own (protobuf<5)
    assert "mediapipe" not in sys.modules and importlib.util.find_spec("mediapipe") is None


def test_end_frame_plays_out_pending_speech_scaled(avatar_path: Path, speech) -> None:
    """EndFrame right after the TTS response: the speech still plays to its end first, scaled down."""
    pcm, rate = speech
    short = pcm[: rate]  # 1 s
    avatar = LipstreamAvatar(avatar_path, output_width=180)

    async def script(worker: PipelineWorker, tts: ScriptedTTS, rec: Recorder) -> None:
        await tts.speak(short, rate)
        await worker.queue_frame(EndFrame())

    recorder, errors = asyncio.run(run_pipeline(avatar, script))
    assert not errors, [e.error for e in errors]
    played = pairs(recorder.items)
    assert {image.size for _, image, _ in played} == {(180, 320)}
    speaking = [audio for _, image, audio in played if info(image)["speaking"]]
    assert abs(len(speaking) * SPF - len(to_16k(short, rate))) < SPF
    kinds = [type(f) for _, f in recorder.items]
    assert kinds.index(TTSStoppedFrame) < kinds.index(EndFrame) == len(kinds) - 1
    assert avatar.session is None


def test_cancel_mid_speech_stops_cleanly(avatar_path: Path, speech) -> None:
    """CancelFrame while speaking: the pipeline stops at once and the session is closed."""
    pcm, rate = speech
    avatar = LipstreamAvatar(avatar_path)

    async def script(worker: PipelineWorker, tts: ScriptedTTS, rec: Recorder) -> None:
        await tts.speak(pcm, rate)
        await rec.wait_for(lambda: any(info(f)["speaking"] for _, f in rec.images()))
        await worker.cancel()

    started = time.perf_counter()
    recorder, errors = asyncio.run(run_pipeline(avatar, script))
    assert not errors, [e.error for e in errors]
    assert time.perf_counter() - started < len(pcm) / rate  # did not wait for the speech to finish
    assert any(isinstance(f, CancelFrame) for _, f in recorder.items)
    assert avatar.session is None


def test_unknown_avatar_is_reported_and_audio_passes() -> None:
    """A bad avatar name is an ErrorFrame, not a hang: the pipeline still runs and TTS audio passes."""
    avatar = LipstreamAvatar("no-such-avatar")
    tone = (np.sin(np.arange(RATE) * 2 * np.pi * 220 / RATE) * 8000).astype(np.int16)

    async def main() -> tuple[Recorder, list[ErrorFrame]]:
        tts, recorder = ScriptedTTS(), Recorder()
        worker, errors = make_worker(tts, avatar, recorder)

        async def drive() -> None:
            await asyncio.sleep(0.3)
            await tts.speak(tone, RATE)
            await worker.queue_frame(EndFrame())

        await asyncio.wait_for(asyncio.gather(run_worker(worker), drive()), 30)
        return recorder, errors

    recorder, errors = asyncio.run(main())
    assert errors and "unknown avatar 'no-such-avatar'" in errors[0].error
    assert sum(isinstance(f, TTSAudioRawFrame) for _, f in recorder.items) == -(-RATE // TTS_CHUNK)
    assert not recorder.images()


def test_playback_path_never_imports_face_tracking(avatar_path: Path) -> None:
    """Loading an avatar, the viseme engine and a Session producing frames import neither the face tracker
    (nor its worker client), nor pipecat, nor torch, though all but mediapipe are installed here."""
    code = f"""
import asyncio, sys
import numpy as np
import lipstream
from lipstream.render.session import RenderSession, SessionConfig

async def main():
    avatar = lipstream.load_avatar({str(avatar_path)!r})
    engine = lipstream.create_engine("viseme")
    async with RenderSession(avatar, engine, SessionConfig(encode=False)) as session:
        session.push_audio(np.sin(np.arange(16000) * 0.1).astype(np.float32) * 0.3, 16000)
        session.flush()
        async for item in session:
            if getattr(item, "speaking", False):
                break
asyncio.run(main())
face = ("lipstream.avatar.tracking", "lipstream.avatar.face_client", "lipstream.avatar.face_worker")
bad = [m for m in ("mediapipe", "pipecat", "torch", *face) if m in sys.modules]
assert not bad, bad
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_bot_speaking_frames_follow_the_face(avatar_path: Path, bundle: AvatarBundle, speech) -> None:
    """Through a real output transport playing in real time: BotStartedSpeakingFrame comes back upstream as
    the first speaking frame starts to play (never for idle frames), BotStoppedSpeakingFrame as the reply's
    last frame ends and at once on an interruption; `agent_state` follows them."""
    pcm, rate = speech
    out = PacedOutput(bundle.size)  # at the pipeline's 24 kHz, in 40 ms chunks: chunk k is frame k's sound
    states: list[tuple[float, str]] = []
    avatar = LipstreamAvatar(avatar_path, on_state=lambda s: states.append((time.perf_counter(), s)))
    tts, watch, cut = ScriptedTTS(), Watcher(out), {}

    async def script(worker: PipelineWorker) -> None:
        await until(lambda: len(out.written) >= 10)  # idling first
        await tts.speak(pcm[: rate * 3 // 2], rate)
        await until(lambda: len(watch.events) == 2)
        await asyncio.sleep(0.3)
        first = out.speech_chunks()
        await tts.speak(pcm, rate)
        await until(lambda: out.speech_chunks() >= first + 15)  # 0.6 s of the second reply has played
        cut["at"] = time.perf_counter()
        await tts.barge_in()
        await asyncio.sleep(0.5)
        await worker.queue_frame(EndFrame())

    async def main() -> list[ErrorFrame]:
        worker, errors = make_worker(tts, watch, avatar, out)
        await play(worker, script(worker))
        return errors

    assert not asyncio.run(main())
    chunks, events = out.written, watch.events
    assert [kind for _, kind, _ in events] == ["started", "stopped", "started", "stopped"]
    speaking = [i for i, (_, meta) in enumerate(out.arrived) if meta["speaking"]]
    talk = [i for i, (_, is_tts, _) in enumerate(chunks) if is_tts]
    # started: as the chunk the first speaking frame completes plays (a chunk takes the class of the frame
    # that completed it: 1-2 buffered idle chunks, silent, may play as TTS, 2 once in a loaded suite)
    (t_on, _, n_on), (t_off, _, n_off) = events[:2]
    assert speaking[0] - 2 <= talk[0] <= speaking[0] and n_on in (talk[0], talk[0] + 1), (talk[0], speaking)
    assert abs(t_on - chunks[talk[0]][0]) < 0.02 and t_on > out.arrived[speaking[0]][0]
    assert max(peak for _, _, peak in chunks[: speaking[0] - 1]) < 50
    # stopped: as the chunk holding the reply's last frame ends
    last = next(i for i in speaking if i + 1 not in speaking)
    end = next(i for i in talk if i + 1 not in talk)
    assert end in (last, last + 1) and n_off in (end + 1, end + 2)
    assert -0.01 < t_off - (chunks[end][0] + 0.04) < 0.04
    # interrupted: stopped at once, no speech plays after it, nothing starts it again
    assert 0 <= events[3][0] - cut["at"] < 0.05, events[3][0] - cut["at"]
    assert not any(is_tts for t, is_tts, _ in chunks if t > events[3][0])
    # agent_state: speaking/listening at the same moments (the interruption's listening at once)
    assert [s for _, s in states] == ["speaking", "listening"] * 2
    assert all(abs(t - e) < 0.02 for (t, _), (e, _, _) in zip(states, events, strict=True))
    assert avatar.agent_state == "listening"

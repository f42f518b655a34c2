"""LiveKit avatar worker (issue 24): LipstreamVideoGenerator against the issue's goals, and its lip-sync
beside `lipstream render` on the same audio, in one run.

Held-out speech: a news bulletin written for this bench, spoken by espeak-ng's en-gb-scotland voice (not a
training voice), resampled from 22.05 to 24 kHz int16 and pushed as 100 ms `rtc.AudioFrame`s (what
livekit's DataStreamAudioReceiver hands the runner), as fast as TTS delivers it. The avatar is the
1080x1920 sample (`lipstream avatar sample --name anchor`).

  live      the generator consumed the way livekit's AvatarRunner does it: each item pushed into a real
            rtc.AVSynchronizer (real AudioSource/VideoSource, 100 ms queues), which paces it in real
            time. Measured: video frames per second over the reply, audio back sample for sample, first
            speaking video frame after the first audio pushed, and clear_buffer -> AudioSegmentEnd at
            five points of five more replies (no audio may follow the clear).
  lip-sync  the generator's frames and returned audio written to an MP4 (H.264 + AAC at 24 kHz, idle
            frames with silence), and `lipstream render --audio` of the same 24 kHz WAV; both measured by
            `lipstream eval lipsync`, which needs face tracking (the face environment, `lipstream
            models face`): run by --eval-python (default this one).

    LIPSTREAM_HOME=~/.lipstream .venv/bin/python -m benchmarks livekit --avatar anchor

Writes benchmarks/results/livekit_bench.json (--live-only: livekit_bench_live.json, no lip-sync part).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

import cv2
import numpy as np
from livekit import rtc
from livekit.agents.voice.avatar import AudioSegmentEnd

from lipstream.audio.decode import resample, to_int16
from lipstream.integrations.livekit import LipstreamVideoGenerator
from lipstream.media.mp4 import Mp4Writer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_common import cpu_model  # noqa: E402

# a bulletin written for this bench (in no training or tuning text), read by a voice no model was trained on
TEXT = (
    "Good afternoon. The river ferry returns to its winter timetable on Monday, with the last crossing "
    "leaving at nine in the evening. Engineers finished testing the new signals on the northern line "
    "overnight, and trains should run on time again from tomorrow morning. At the town hall, the council "
    "voted to plant four hundred trees along the avenue before the spring. The library's reading week "
    "starts on Saturday with a story hour for children. Expect a cold, bright day with a light wind from "
    "the east. Those are the headlines; we will be back at six."
)
ESPEAK_VOICE = "en-gb-scotland"
RATE = 24_000
CHUNK = RATE // 10
FRAME = RATE // 25
CLEAR_AFTER_SECONDS = (0.5, 1.3, 2.1, 2.9, 3.7)


def bulletin_24k(work: Path, seconds: float) -> np.ndarray:
    """The bulletin by espeak-ng (en-gb-scotland), at 24 kHz int16, cut to `seconds`."""
    path = work / "bulletin.wav"
    subprocess.run(["espeak-ng", "-v", ESPEAK_VOICE, "-w", str(path), TEXT], check=True, timeout=120)
    with wave.open(str(path)) as wav:
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), np.int16)
        rate = wav.getframerate()
    return to_int16(resample(pcm, rate, RATE))[: int(seconds * RATE)]


def write_wav(path: Path, pcm: np.ndarray) -> None:
    """24 kHz mono int16 WAV."""
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(RATE)
        wav.writeframes(pcm.tobytes())


async def push_reply(generator: LipstreamVideoGenerator, pcm: np.ndarray) -> float:
    """Push a reply as 100 ms frames and its end; returns when the first frame was pushed."""
    first = time.perf_counter()
    for start in range(0, len(pcm), CHUNK):
        piece = pcm[start : start + CHUNK]
        await generator.push_audio(rtc.AudioFrame(piece.tobytes(), RATE, 1, len(piece)))
    await generator.push_audio(AudioSegmentEnd())
    return first


async def live_run(avatar: str, speech: np.ndarray, video_format: str, output_width: int | None) -> dict:
    """The generator through a real AVSynchronizer: fps, sample-exactness, first-frame and clear latency."""
    generator = LipstreamVideoGenerator(avatar, video_format=video_format, output_width=output_width)
    await generator.start()
    audio_source = rtc.AudioSource(RATE, 1, queue_size_ms=100)
    video_source = rtc.VideoSource(generator.width, generator.height)
    av_sync = rtc.AVSynchronizer(
        audio_source=audio_source, video_source=video_source, video_fps=25, video_queue_size_ms=100
    )
    log: list[tuple[float, object]] = []

    async def forward() -> None:  # what AvatarRunner._forward_video does with each item
        async for item in generator:
            log.append((time.perf_counter(), item))  # when the runner gets it
            if not isinstance(item, AudioSegmentEnd):
                await av_sync.push(item)

    task = asyncio.create_task(forward())
    await asyncio.sleep(1.0)  # idle first
    start_index = len(log)
    pushed_at = await push_reply(generator, speech)
    while not any(isinstance(x, AudioSegmentEnd) for _, x in log[start_index:]):
        await asyncio.sleep(0.05)
    reply = log[start_index:]
    audio = [x for _, x in reply if isinstance(x, rtc.AudioFrame)]
    returned = np.concatenate([np.frombuffer(a.data, np.int16) for a in audio])
    pairs = zip(reply, reply[1:], strict=False)
    speaking_video = [
        t for (t, x), (_, nxt) in pairs if isinstance(x, rtc.VideoFrame) and isinstance(nxt, rtc.AudioFrame)
    ]
    span = speaking_video[-1] - speaking_video[0]
    result = {
        "video_format": video_format,
        "size": f"{generator.width}x{generator.height}",
        "speech_seconds": round(len(speech) / RATE, 2),
        "fps_during_reply": round((len(speaking_video) - 1) / span, 3),
        "av_sync_actual_fps": round(av_sync.actual_fps, 2),
        "audio_sample_exact": bool(len(returned) == len(speech) and np.array_equal(returned, speech)),
        "first_video_after_first_audio_ms": round((speaking_video[0] - pushed_at) * 1000, 1),
    }
    await asyncio.sleep(1.0)
    clears, audio_after = [], 0
    for offset in CLEAR_AFTER_SECONDS:
        mark = len(log)
        await push_reply(generator, speech)
        while True:
            speaking = [t for t, x in log[mark:] if isinstance(x, rtc.AudioFrame)]
            if speaking and time.perf_counter() - speaking[0] >= offset:
                break
            await asyncio.sleep(0.005)
        cleared = time.perf_counter()
        cut = len(log)
        generator.clear_buffer()
        while not any(isinstance(x, AudioSegmentEnd) for _, x in log[cut:]):
            await asyncio.sleep(0.002)
        end_at = next(t for t, x in log[cut:] if isinstance(x, AudioSegmentEnd))
        clears.append(round((end_at - cleared) * 1000, 1))
        await asyncio.sleep(0.8)
        audio_after += sum(isinstance(x, rtc.AudioFrame) for _, x in log[cut:])
    result["clear_to_segment_end_ms"] = clears
    result["audio_frames_after_clear"] = audio_after
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await generator.aclose()
    await av_sync.aclose()
    await audio_source.aclose()
    await video_source.aclose()
    return result


async def record_run(avatar: str, speech: np.ndarray, path: Path) -> None:
    """The generator's frames and returned audio, as they come, into an MP4 (silence under idle frames)."""
    generator = LipstreamVideoGenerator(avatar)
    await generator.start()
    writer = Mp4Writer(path, generator.width, generator.height, sample_rate=RATE, crf=18, preset="veryfast")
    pending: rtc.VideoFrame | None = None

    def put_video(frame: rtc.VideoFrame, audio: np.ndarray) -> None:
        yuv = np.frombuffer(frame.data, np.uint8).reshape(frame.height * 3 // 2, frame.width)
        image = cv2.cvtColor(yuv, cv2.COLOR_YUV2RGB_I420)  # the writer takes RGB
        writer.write_frame(image)
        writer.write_audio(np.concatenate([audio, np.zeros(FRAME - len(audio), np.int16)]))

    iterator = generator.__aiter__()
    await push_reply(generator, speech)
    while True:
        item = await iterator.__anext__()
        if isinstance(item, rtc.VideoFrame):
            if pending is not None:
                put_video(pending, np.zeros(0, np.int16))
            pending = item
        elif isinstance(item, rtc.AudioFrame):
            assert pending is not None
            put_video(pending, np.frombuffer(item.data, np.int16))
            pending = None
        else:
            break
    writer.close()
    await generator.aclose()


def lipsync(eval_python: str, video: Path, env: dict) -> dict:
    """`lipstream eval lipsync --json` of a video, run by `eval_python`."""
    done = subprocess.run(
        [eval_python, "-m", "lipstream", "eval", "lipsync", str(video), "--json", "--no-progress",
         "--plot", str(video.with_suffix(".png"))],
        capture_output=True, text=True, env=env, timeout=1800,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"eval lipsync failed on {video}: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def lipsync_pair(args: argparse.Namespace, speech: np.ndarray, wav: Path, work: Path) -> dict:
    """`eval lipsync` of the generator's MP4 and of `lipstream render` on the same WAV."""
    generated = work / "livekit_generator.mp4"
    asyncio.run(record_run(args.avatar, speech, generated))  # full size, the default I420
    rendered = work / "render.mp4"
    subprocess.run(
        [sys.executable, "-m", "lipstream", "render", "--avatar", args.avatar, "--audio", str(wav),
         "-o", str(rendered), "--no-progress"],
        check=True, timeout=1800,
    )  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return {name: lipsync(args.eval_python, path, env) for name, path in
            (("render", rendered), ("livekit_generator", generated))}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    """Run both parts; print the table; write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--avatar", default="anchor", help="prepared avatar with viseme caches (name or folder)")
    ap.add_argument("--seconds", type=float, default=30.0, help="speech length (default 30 s)")
    ap.add_argument(
        "--eval-python", default=sys.executable,
        help="interpreter that runs `lipstream eval lipsync` (it needs the face environment)",
    )  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--live-only", action="store_true", help="skip the lip-sync part (~8 of the ~11 min)")
    args = ap.parse_args(argv)
    if shutil.which("espeak-ng") is None:
        raise SystemExit("espeak-ng is needed (make setup installs it)")
    work = Path(tempfile.mkdtemp(prefix="livekit-bench-"))
    speech = bulletin_24k(work, args.seconds)
    wav = work / "bulletin24k.wav"
    write_wav(wav, speech)

    live = {
        f"{fmt} {width or 'full'}": asyncio.run(live_run(args.avatar, speech[: 6 * RATE], fmt, width))
        for width in (None, 540)
        for fmt in ("rgb24", "i420")
    }
    reports = {} if args.live_only else lipsync_pair(args, speech, wav, work)

    print(f"\nLiveKit avatar worker, {cpu_model()}, {len(speech) / RATE:.1f} s of held-out speech at 24 kHz")
    print(
        "  live: a 6 s reply through a real AVSynchronizer; rgb24 = RGB pictures (before), i420 = the default"
    )
    rows = (
        ("size", "size", "{}"),
        ("fps during the reply (25 +- 1)", "fps_during_reply", "{:.2f}"),
        ("av_sync.actual_fps", "av_sync_actual_fps", "{:.2f}"),
        ("audio returned sample-exact", "audio_sample_exact", "{}"),
        ("first video after 1st audio ms (<=300)", "first_video_after_first_audio_ms", "{:.1f}"),
        ("clear -> segment end ms (<=100)", "clear_to_segment_end_ms", "{}"),
        ("audio frames after a clear", "audio_frames_after_clear", "{}"),
    )
    print("    " + " " * 40 + "".join(f"{name:>34}" for name in live))
    for label, key, fmt in rows:
        print(f"    {label:40s}" + "".join(f"{fmt.format(case[key]):>34}" for case in live.values()))
    if reports:
        print("  lip-sync (lipstream eval lipsync)       render   livekit generator")
        for key in ("correlation_best", "best_lag_frames", "correlation_lag0", "correlation_speech_lag0",
                    "silent_closed_share"):  # fmt: skip
            render, generator = reports["render"].get(key), reports["livekit_generator"].get(key)
            print(f"    {key:32s} {render!s:>8} {generator!s:>12}")
    result = {
        "date": time.strftime("%Y-%m-%d"), "cpu": cpu_model(), "python": platform.python_version(),
        "avatar": args.avatar, "speech_seconds": round(len(speech) / RATE, 2),
        "voice": f"espeak-ng {ESPEAK_VOICE}",
        "live": live, "lipsync": reports,
    }  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    name = "livekit_bench_live.json" if args.live_only else "livekit_bench.json"
    (args.out / name).write_text(json.dumps(result, indent=2) + "\n")
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

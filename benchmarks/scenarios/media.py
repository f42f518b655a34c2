"""Media and speech I/O speed: Mp4Writer and H264StreamEncoder ms/frame, RGB->YUV paths, TTS real-time factor.

Run: OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks media [--frames 100] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import av
import cv2
import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from skimage.data import astronaut

from lipstream.media.h264 import H264StreamEncoder
from lipstream.media.mp4 import Mp4Writer
from lipstream.media.yuv import rgb_to_yuv420p
from lipstream.talk.voices.tts import EspeakTTS, PiperTTS

PRESETS = ("veryfast", "superfast", "ultrafast")  # compared side by side with the default "fast"
SIZES = {"1080x1920": (1080, 1920), "540x960": (540, 960)}
TEXT = (
    "Good evening. Tonight the city council approved the new budget after a long debate. "
    "The bridge on Main Street reopens on Monday, three weeks ahead of schedule. "
    "Forecasters expect a dry and sunny weekend, with temperatures rising to twenty five degrees."
)


def _frames(width: int, height: int, count: int) -> list[np.ndarray]:
    """A moving, detailed picture at the target size (the astronaut, upscaled, drifting)."""
    base = cv2.resize(astronaut(), (width, height), interpolation=cv2.INTER_CUBIC)
    return [np.roll(base, 4 * i, axis=1) for i in range(count)]


def bench_yuv(frames: list[np.ndarray]) -> dict[str, float]:
    """ms per frame of cv2 I420 conversion vs PyAV's swscale reformat."""
    start = time.perf_counter()
    for frame in frames:
        rgb_to_yuv420p(frame)
    cv2_ms = (time.perf_counter() - start) * 1000 / len(frames)
    start = time.perf_counter()
    for frame in frames:
        av.VideoFrame.from_ndarray(frame, format="rgb24").reformat(format="yuv420p")
    sws_ms = (time.perf_counter() - start) * 1000 / len(frames)
    return {"cv2_i420_ms": cv2_ms, "pyav_reformat_ms": sws_ms, "speedup": sws_ms / cv2_ms}


def bench_mp4(
    frames: list[np.ndarray], width: int, height: int, progress: Progress, preset: str = "fast"
) -> dict[str, float]:
    """ms per frame of Mp4Writer, including 40 ms of AAC audio per frame and the final mux."""
    audio = (0.1 * np.sin(np.arange(640 * len(frames)) / 5)).astype(np.float32)
    task = progress.add_task(f"mp4 {width}x{height} {preset}", total=len(frames))
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        with Mp4Writer(Path(folder) / "bench.mp4", width, height, preset=preset) as writer:
            for i, frame in enumerate(frames):
                writer.write_frame(frame)
                writer.write_audio(audio[640 * i : 640 * (i + 1)])
                progress.advance(task)
        total = time.perf_counter() - start
        size = (Path(folder) / "bench.mp4").stat().st_size
    return {
        "ms_per_frame": total * 1000 / len(frames),
        "fps": len(frames) / total,
        "kbit_s": size * 8 / 1000 / (len(frames) / 25),
    }


def bench_h264(
    frames: list[np.ndarray],
    width: int,
    height: int,
    progress: Progress,
    output_size: tuple[int, int] | None = None,
) -> dict[str, float]:
    """ms per frame (mean and p95) of the live encoder, one access unit per call."""
    encoder = H264StreamEncoder(width, height, output_size=output_size)
    label = f"h264 {width}x{height}" + (f"->{output_size[0]}x{output_size[1]}" if output_size else "")
    task = progress.add_task(label, total=len(frames))
    times, sizes = [], []
    for i, frame in enumerate(frames):
        start = time.perf_counter()
        unit = encoder.encode(frame, force_idr=i % 100 == 0)
        times.append(time.perf_counter() - start)
        sizes.append(len(unit.data))
        progress.advance(task)
    ms = np.array(times) * 1000
    return {
        "ms_per_frame": float(ms.mean()),
        "p95_ms": float(np.percentile(ms, 95)),
        "kbit_s": float(sum(sizes) * 8 / 1000 / (len(frames) / 25)),
        "codec": encoder.codec_string,
    }


def bench_tts(progress: Progress, repeats: int) -> dict[str, dict[str, float]]:
    """Real-time factor (synthesis seconds / audio seconds) of both voices, plus first-sentence latency."""
    results = {}
    for name, factory in (("piper", PiperTTS), ("espeak", EspeakTTS)):
        task = progress.add_task(f"tts {name}", total=repeats + 1)
        start = time.perf_counter()
        tts = factory()
        load_s = time.perf_counter() - start
        progress.advance(task)
        walls, audio_s = [], 0.0
        for _ in range(repeats):
            start = time.perf_counter()
            speech = tts.synthesize(TEXT)
            walls.append(time.perf_counter() - start)
            audio_s = speech.seconds
            progress.advance(task)
        start = time.perf_counter()
        next(iter(tts.synthesize_sentences(TEXT)))
        first_s = time.perf_counter() - start
        wall = float(np.median(walls))
        results[name] = {
            "load_s": load_s,
            "audio_s": audio_s,
            "synth_s": wall,
            "rtf": wall / audio_s,
            "first_sentence_s": first_s,
        }
    return results


def main(argv: list[str] | None = None) -> int:
    """Run every benchmark, print a table and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--frames", type=int, default=100, help="frames per encoder run")
    parser.add_argument("--tts-repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/media_bench.json"))
    args = parser.parse_args(argv)
    console = Console()
    report: dict = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, {platform.python_version()}",
        "av": av.__version__,
        "frames": args.frames,
    }
    with Progress(console=console) as progress:
        for label, (width, height) in SIZES.items():
            frames = _frames(width, height, args.frames)
            report[f"yuv_{label}"] = bench_yuv(frames[:30])
            report[f"mp4_{label}"] = bench_mp4(frames, width, height, progress)
            for preset in PRESETS:
                report[f"mp4_{label}_{preset}"] = bench_mp4(frames, width, height, progress, preset)
            report[f"h264_{label}"] = bench_h264(frames, width, height, progress)
            if label == "1080x1920":
                report["h264_1080x1920_to_540x960"] = bench_h264(frames, width, height, progress, (540, 960))
            del frames
        report["tts"] = bench_tts(progress, args.tts_repeats)
    table = Table(title="Media and speech I/O")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for key, value in report.items():
        if isinstance(value, dict):
            for sub, number in value.items():
                if isinstance(number, dict):
                    for k, v in number.items():
                        table.add_row(f"{key}.{sub}.{k}", f"{v:.3f}")
                else:
                    table.add_row(
                        f"{key}.{sub}", f"{number:.3f}" if isinstance(number, float) else str(number)
                    )
    console.print(table)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2))
    console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

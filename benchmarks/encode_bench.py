"""H.264 settings of the offline render (issue 11): encode speed against picture quality, side by side.

Run: LIPSTREAM_HOME=out/home OMP_NUM_THREADS=2 .venv/bin/python benchmarks/encode_bench.py [--seconds 6]

Renders a few seconds of the 1080×1920 `sample` avatar speaking (the render's own features, scheduler
and compositor, so the mouth moves), keeps the I420 pictures the encoder would get, then encodes the
same pictures once per libx264 setting through `Mp4Writer` and measures: ms per frame of encoding
(wall and process CPU, all encoder threads), video bitrate, and luma PSNR of the decoded MP4 against
the lossless pictures over the whole frame and over the mouth rectangle. Every setting runs in the
same process, `--repeats` times interleaved (the fastest run counts), so ratios are from one run.
Writes benchmarks/results/encode_bench.json and mouth crops (PNG, enlarged) under --png-dir.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import av
import cv2
import numpy as np
from bench_common import cpu_model, open_or_build_avatar

from lipstream.audio.levels import SilenceDetector
from lipstream.audio.timeline import FPS
from lipstream.engines.registry import create_engine
from lipstream.media.mp4 import Mp4Writer
from lipstream.render.accel import AccelConfig, PatchScheduler, resolve_accel, utterance_frames
from lipstream.render.compositor import Compositor
from lipstream.talk.tts import create_tts

RESULTS = Path(__file__).resolve().parent / "results"
SCRIPT = (
    "Good evening. The old bridge reopened this afternoon after three years of repairs, "
    "and thousands of people walked across it before the sun went down."
)
PRESETS = ("ultrafast", "superfast", "veryfast", "faster", "fast")


@dataclass(frozen=True)
class Setting:
    """One libx264 configuration to measure."""

    preset: str
    crf: int = 20
    threads: int = 0  # 0: libx264 chooses (auto)
    tune: str | None = None

    @property
    def label(self) -> str:
        """Short name for tables and file names."""
        threads = "auto" if self.threads == 0 else str(self.threads)
        return f"{self.preset} crf{self.crf} t{threads}{' ' + self.tune if self.tune else ''}"


def default_settings() -> list[Setting]:
    """Every preset at the render's old CRF; threads and tune varied around the candidates; a CRF sweep."""
    settings = [Setting(p) for p in PRESETS]
    settings += [Setting(p, threads=t) for p in ("ultrafast", "superfast", "veryfast") for t in (1, 2)]
    settings += [Setting(p, tune="zerolatency") for p in ("ultrafast", "superfast", "veryfast")]
    settings += [Setting("superfast", crf=c) for c in (18, 23)]
    settings += [Setting("ultrafast", crf=c) for c in (18, 23, 26)]
    settings += [Setting("veryfast", crf=23), Setting("fast", crf=23)]  # the Mp4Writer default
    return settings


def speaking_pictures(bundle, seconds: float, voice: str) -> tuple[list[np.ndarray], list[tuple], list[int]]:
    """I420 pictures of the avatar speaking (as the render composes them), mouth rectangles, base ids."""
    speech = create_tts(voice).synthesize(SCRIPT)
    engine = create_engine("viseme")
    engine.prepare(bundle)
    accel = resolve_accel(AccelConfig(), engine)
    frames = utterance_frames(bundle, engine, speech, accel, SilenceDetector())
    n = min(len(frames.base_ids), int(seconds * FPS))
    sched = PatchScheduler(bundle, engine, accel, None)
    ids = list(range(n))
    released = sched.push(frames.features[:n], frames.skip[:n], frames.base_ids[:n], ids) + sched.finish()
    comp = Compositor(bundle, engine.patch_size)
    pictures, rects, bases = [], [], []
    for k, patch in sorted(released, key=lambda kp: kp[0]):
        base = int(frames.base_ids[k])
        pictures.append(comp.compose_i420(base, patch))
        geo = comp.geometry(base)
        rects.append(geo.rect if geo else (0, 0, bundle.size[0], bundle.size[1]))
        bases.append(base)
    return pictures, rects, bases


def encode(pictures: list[np.ndarray], size: tuple[int, int], setting: Setting, path: Path) -> dict:
    """Encode the pictures with one setting; wall and CPU ms per frame of the encoder alone."""
    width, height = size
    with Mp4Writer(
        path, width, height, preset=setting.preset, crf=setting.crf, threads=setting.threads,
        tune=setting.tune,
    ) as writer:
        wall, cpu = time.perf_counter(), time.process_time()
        for picture in pictures:
            writer.write_frame(picture)
        writer.close()  # flushes the frames libx264 still holds (lookahead, frame threads)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    n = len(pictures)
    return {"wall_ms": wall * 1000 / n, "cpu_ms": cpu * 1000 / n}


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two uint8 arrays (99 when identical)."""
    mse = float(np.mean((a.astype(np.float32) - b.astype(np.float32)) ** 2))
    return 99.0 if mse == 0 else 10 * float(np.log10(255.0**2 / mse))


def decoded_luma(path: Path) -> tuple[list[np.ndarray], int]:
    """Decoded Y planes of the MP4's video and the total size in bytes of its video packets."""
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        lumas, size = [], 0
        for packet in container.demux(stream):
            size += packet.size
            for frame in packet.decode():
                # native yuv420p, no swscale: a "gray" conversion would also expand limited range
                lumas.append(frame.to_ndarray()[: frame.height])
    return lumas, size


def quality(path: Path, pictures: list[np.ndarray], rects: list[tuple], size: tuple[int, int]) -> dict:
    """Bitrate and luma PSNR (whole frame, mouth rectangle) of the MP4 against the source pictures."""
    width, height = size
    lumas, nbytes = decoded_luma(path)
    if len(lumas) != len(pictures):
        raise RuntimeError(f"{path.name}: decoded {len(lumas)} of {len(pictures)} frames")
    whole, mouth = [], []
    for luma, picture, (x0, y0, x1, y1) in zip(lumas, pictures, rects, strict=True):
        source = picture[:height]  # the Y plane of the I420 picture
        whole.append(psnr(luma, source))
        mouth.append(psnr(luma[y0:y1, x0:x1], source[y0:y1, x0:x1]))
    seconds = len(pictures) / FPS
    return {
        "kbit_s": nbytes * 8 / seconds / 1000,
        "psnr_y_db": float(np.mean(whole)),
        "psnr_y_mouth_db": float(np.mean(mouth)),
        "psnr_y_mouth_min_db": float(np.min(mouth)),
    }


def widest_mouth(pictures: list[np.ndarray], rects: list[tuple], height: int) -> int:
    """Index of the picture whose mouth rectangle has the most luma detail (open mouth, teeth)."""
    pairs = zip(pictures, rects, strict=True)
    spread = [float(p[:height][y0:y1, x0:x1].std()) for p, (x0, y0, x1, y1) in pairs]
    return int(np.argmax(spread))


def save_mouth_crops(crops: dict[str, np.ndarray], out_dir: Path, scale: int = 4, columns: int = 4) -> Path:
    """One PNG per setting plus a labelled grid, each mouth enlarged `scale`× without smoothing."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tiles = []
    for label, crop in crops.items():
        big = cv2.resize(crop, None, fx=scale, fy=scale, interpolation=cv2.INTER_NEAREST)
        big = cv2.cvtColor(big, cv2.COLOR_RGB2BGR)
        cv2.imwrite(str(out_dir / f"mouth_{label.replace(' ', '_')}.png"), big)
        tile = cv2.copyMakeBorder(big, 28, 4, 4, 4, cv2.BORDER_CONSTANT, value=(255, 255, 255))
        cv2.putText(tile, label, (6, 20), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (0, 0, 0), 1, cv2.LINE_AA)
        tiles.append(tile)
    tiles += [np.full_like(tiles[0], 255)] * (-len(tiles) % columns)
    rows = [np.hstack(tiles[i : i + columns]) for i in range(0, len(tiles), columns)]
    grid = out_dir / "mouth_grid.png"
    cv2.imwrite(str(grid), np.vstack(rows))
    return grid


def i420_mouth_rgb(picture: np.ndarray, rect: tuple) -> np.ndarray:
    """RGB of an I420 picture's mouth rectangle (even-aligned, as the compositor makes it)."""
    x0, y0, x1, y1 = rect
    return cv2.cvtColor(picture, cv2.COLOR_YUV2RGB_I420)[y0:y1, x0:x1]


def clip_path(work: Path, label: str) -> Path:
    """Where one setting's MP4 goes."""
    return work / f"{label.replace(' ', '_')}.mp4"


def decoded_mouth(path: Path, index: int, rect: tuple) -> np.ndarray:
    """RGB mouth rectangle of one decoded frame, converted the same way as the source's."""
    with av.open(str(path)) as container:
        for i, frame in enumerate(container.decode(video=0)):
            if i == index:
                return i420_mouth_rgb(frame.to_ndarray(), rect)
    raise RuntimeError(f"{path.name} has no frame {index}")


def measure(settings: list[Setting], pictures, rects, size, repeats: int, work: Path) -> list[dict]:
    """Encode every setting `repeats` times interleaved (fastest run kept), then measure its quality."""
    times: dict[Setting, list[dict]] = {s: [] for s in settings}
    for _ in range(repeats):
        for s in settings:
            times[s].append(encode(pictures, size, s, clip_path(work, s.label)))
            print(f"  {s.label:34s} {times[s][-1]['wall_ms']:6.1f} ms/frame wall", flush=True)
    rows = []
    for s in settings:
        best = min(times[s], key=lambda t: t["wall_ms"])
        q = quality(clip_path(work, s.label), pictures, rects, size)
        row = {"label": s.label, **asdict(s), **best, **q}
        rows.append({k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()})
    return rows


def print_table(rows: list[dict], cpu: str) -> None:
    """The side-by-side table (markdown, as docs/benchmarks.md shows it)."""
    print(f"\nCPU: {cpu}, {os.cpu_count()} cpus, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    print("| setting | encode ms/frame (wall) | CPU ms/frame | kbit/s | PSNR-Y frame | PSNR-Y mouth (min) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['label']} | {r['wall_ms']:.1f} | {r['cpu_ms']:.1f} | {r['kbit_s']:.0f} "
            f"| {r['psnr_y_db']:.2f} | {r['psnr_y_mouth_db']:.2f} ({r['psnr_y_mouth_min_db']:.2f}) |"
        )


def main() -> None:
    """Build the pictures, measure every setting, print the table and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--avatar", default="sample")
    parser.add_argument("--seconds", type=float, default=6.0, help="length of the speaking clip")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--voice", default="piper")
    parser.add_argument("--png-dir", type=Path, default=None, help="mouth crops (default: a temp folder)")
    parser.add_argument("--out", type=Path, default=RESULTS / "encode_bench.json")
    args = parser.parse_args()
    bundle = open_or_build_avatar(args.avatar)
    pictures, rects, _ = speaking_pictures(bundle, args.seconds, args.voice)
    size = bundle.size
    print(f"{len(pictures)} speaking frames at {size[0]}×{size[1]}, {len(default_settings())} settings")
    work = Path(tempfile.mkdtemp(prefix="encode-bench-"))
    load_before = os.getloadavg()[0]
    rows = measure(default_settings(), pictures, rects, size, args.repeats, work)
    cpu = cpu_model()
    print_table(rows, cpu)
    index = widest_mouth(pictures, rects, size[1])
    crops = {"source": i420_mouth_rgb(pictures[index], rects[index])}
    for r in rows:
        if r["threads"] == 0 and not r["tune"]:
            crops[r["label"]] = decoded_mouth(clip_path(work, r["label"]), index, rects[index])
    grid = save_mouth_crops(crops, args.png_dir or work / "png")
    print(f"mouth crops of frame {index}: {grid}")
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu_model": cpu,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus",
        "load_average": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "avatar": {"name": bundle.name, "size": list(size)},
        "frames": len(pictures),
        "repeats": args.repeats,
        "psnr": "luma; decoded MP4 vs the I420 pictures given to the encoder; mouth: the mask rectangle",
        "settings": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

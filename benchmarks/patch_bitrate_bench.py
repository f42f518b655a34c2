"""Mouth-patch bitrate vs picture (issue 24: a patch-mode session under 200 kbit/s while it speaks).

The engine's patches for held-out speech (Piper, 15 s, continuous) on the 1080×1920 sample avatar are encoded
as the server encodes them (`MouthPatchH264`: the crop-space patch rectangle, Constrained Baseline, one-second
VBV) at each bitrate in --bitrates, every bitrate over the same frames in one run; each stream is decoded
(PyAV) and compared with the engine's patch inside the frame's mouth mask. Per bitrate: the bitrate the
stream actually used, mouth PSNR (mean, 5th percentile, worst) and SSIM (mean, worst), encode ms per frame.
Writes benchmarks/results/patch_bitrate_bench.json and a PNG of the same frames at every bitrate, enlarged
to the size the page shows them (docs/img/patch_bitrate.png), to look at.

    OMP_NUM_THREADS=1 LIPSTREAM_HOME=… .venv/bin/python benchmarks/patch_bitrate_bench.py
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import av
import cv2
import numpy as np
from skimage.metrics import structural_similarity

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_common import cpu_model, open_or_build_avatar  # noqa: E402
from lipsync_bench import speech_of  # noqa: E402

from lipstream.avatar.bundle import CROP_SIZE  # noqa: E402
from lipstream.engines.viseme.articulation import OPEN  # noqa: E402
from lipstream.engines.viseme.engine import VisemeEngine  # noqa: E402
from lipstream.render.patch_stream import patch_rect  # noqa: E402
from lipstream.render.sinks import MouthPatchH264  # noqa: E402
from lipstream.render.timing import StageTimer  # noqa: E402

FPS = 25


def engine_patches(bundle, seconds: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every frame's engine patch (CROP_SIZE² RGB) for the held-out speech, the shown frame of each, and
    each frame's opening (the engine's feature)."""
    engine = VisemeEngine()
    engine.prepare(bundle)
    feats = engine.features(speech_of("piper", seconds))
    ids = np.array([bundle.base_frame_index(i) for i in range(len(feats))])
    out = [engine.render(bundle, feats[s : s + engine.batch_size], ids[s : s + engine.batch_size])
           for s in range(0, len(feats), engine.batch_size)]  # fmt: skip
    return np.concatenate(out), ids, feats[:, OPEN]


def code_at(
    bitrate: int, patches: np.ndarray, rect: tuple[int, int, int, int]
) -> tuple[list[np.ndarray], int, float]:
    """Encode the patches as the server does at `bitrate`; the decoded rectangles, total bytes, ms/frame."""
    sink = MouthPatchH264(rect, bitrate)
    sink.bind(compositor=None, timer=StageTimer())  # the patch sink composites nothing
    sink.open()
    decoder = av.CodecContext.create("h264", "r")
    decoded, size = [], 0
    t0 = time.process_time()
    units = [sink.make(0, patch, 1) for patch in patches]
    encode_ms = (time.process_time() - t0) * 1000 / len(patches)
    for unit in units:
        size += len(unit.data)
        frames = decoder.decode(av.Packet(unit.data))
        decoded.append(frames[0].to_ndarray(format="rgb24"))
    return decoded, size, encode_ms


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two same-shape pixel arrays."""
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return 99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse)


def sheet(rows: list[tuple[str, list[np.ndarray]]], scale: float, path: Path) -> None:
    """One labelled row per bitrate of the chosen frames, enlarged by `scale` (what the page shows)."""
    lines = []
    for label, crops in rows:
        big = [cv2.resize(c, None, fx=scale, fy=scale, interpolation=cv2.INTER_CUBIC) for c in crops]
        line = np.concatenate([np.pad(b, ((0, 0), (0, 6), (0, 0)), constant_values=255) for b in big], axis=1)
        band = np.full((28, line.shape[1], 3), 255, np.uint8)
        cv2.putText(band, label, (6, 20), cv2.FONT_HERSHEY_SIMPLEX, 0.7, (0, 0, 0), 2)
        lines.append(np.concatenate([band, line]))
    width = max(line.shape[1] for line in lines)
    lines = [
        np.pad(line, ((0, 0), (0, width - line.shape[1]), (0, 0)), constant_values=255) for line in lines
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), cv2.cvtColor(np.concatenate(lines), cv2.COLOR_RGB2BGR))


def main() -> None:
    """Encode the same patches at every bitrate; print and write the figures side by side."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--avatar", default="sample")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--bitrates", type=int, nargs="+", default=[300_000, 200_000, 150_000, 120_000, 100_000])
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/patch_bitrate_bench.json")
    ap.add_argument("--png", type=Path, default=REPO / "docs/img/patch_bitrate.png")
    args = ap.parse_args()
    bundle = open_or_build_avatar(args.avatar)
    rect = patch_rect(bundle)
    x0, y0, x1, y1 = rect
    patches, ids, opening = engine_patches(bundle, args.seconds)
    wants = [p[y0:y1, x0:x1] for p in patches]
    masks = [np.asarray(bundle.masks[int(i)])[y0:y1, x0:x1] > 0 for i in ids]
    order = np.argsort(opening)  # the widest opening and one at the 75th percentile
    shown = [int(order[-1]), int(order[len(order) * 3 // 4])]
    # the crop is shown at the face box's size on the page: enlarge by that over CROP_SIZE
    scale = float(np.median(np.asarray(bundle.boxes)[:, 2] - np.asarray(bundle.boxes)[:, 0])) / CROP_SIZE
    results, rows = [], [("engine patch (reference)", [wants[k] for k in shown])]
    for bitrate in args.bitrates:
        decoded, size, encode_ms = code_at(bitrate, patches, rect)
        p = [psnr(d[m], w[m]) for d, w, m in zip(decoded, wants, masks, strict=True)]
        s = [structural_similarity(d, w, channel_axis=2) for d, w in zip(decoded, wants, strict=True)]
        worst = int(np.argmin(p))
        row = {
            "asked_kbit_s": bitrate / 1000,
            "used_kbit_s": round(size * 8 * FPS / len(decoded) / 1000, 1),
            "mouth_psnr_mean_db": round(float(np.mean(p)), 2),
            "mouth_psnr_p5_db": round(float(np.percentile(p, 5)), 2),
            "mouth_psnr_worst_db": round(float(np.min(p)), 2),
            "ssim_mean": round(float(np.mean(s)), 4),
            "ssim_worst": round(float(np.min(s)), 4),
            "encode_ms_per_frame": round(encode_ms, 3),
            "worst_frame": worst,
        }
        results.append(row)
        print(json.dumps(row), flush=True)
        label = f"{bitrate // 1000} kbit/s: {row['used_kbit_s']} used, PSNR {row['mouth_psnr_mean_db']} dB"
        rows.append((label, [decoded[k] for k in shown]))
    sheet(rows, scale, args.png)
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": cpu_model(),
        "avatar": args.avatar,
        "rect": rect,
        "frames": len(patches),
        "shown_frames": shown,
        "display_scale": round(scale, 2),
        "bitrates": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.out} and {args.png}")


if __name__ == "__main__":
    main()

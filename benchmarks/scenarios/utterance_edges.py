"""Utterance edges: how far the drawn mouth jumps in one frame where speech meets the footage.

A live session shows the footage as filmed between utterances and the engine's mouth during them. Before
this change the switch took one frame: on the sample, whose rest mouth shows its teeth, the lips shut over
them in one 40 ms frame when a quiet start began and bared them again in one when speech ended. Both sides
run here in one process on the same speech: `EdgeConfig(frames=0)` (the switch in one frame) and the default.

Per avatar (the sample clip and the photo, each prepared once) and per speech (espeak-ng with 0.3 s of silence
before and after it, and the same speech cut at its last voiced frame): a live Session (raw RGB frames)
idles, speaks, idles again. The drawn mouth of frame k is D_k = frame_k - footage_k below the face box's
midline (the head's own motion cancels out, the eyes are outside); a frame's step is mean |D_k - D_(k-1)|.
Figures: the largest step at the start (the last idle frame and the utterance's first EdgeConfig.frames + 1),
the largest at the end (its last frame and the EdgeConfig.frames + 1 after), and the median and 95th
percentile step inside the speech (ordinary lip motion) to compare them with. Writes
benchmarks/results/edges_bench.json and docs/img/utterance_edges.png (the sample's mouth around the end of
speech, both sides, enlarged).

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks utterance_edges
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
from bench_common import cpu_model

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
TEXT = "Good evening. The harbour bridge reopened tonight after three weeks of repairs."
IDLE_BEFORE, IDLE_AFTER = 6, 10


async def live_frames(bundle, engine, pcm: np.ndarray) -> list:
    """Frames of a live session: idle, the speech, idle again."""
    from lipstream.render.frames import AvatarFrame
    from lipstream.render.session import RenderSession, SessionConfig, SessionEvent

    frames = []
    async with RenderSession(bundle, engine, SessionConfig(encode=False)) as session:
        stream = session.__aiter__()
        for _ in range(IDLE_BEFORE):
            frames.append(await anext(stream))
        session.push_audio(pcm)
        session.flush()
        async for item in stream:
            frames.append(item)
            if isinstance(item, SessionEvent) and item.type == "playback_finished":
                break
        for _ in range(IDLE_AFTER):
            frames.append(await anext(stream))
    return [f for f in frames if isinstance(f, AvatarFrame)]


def drawn_mouth(bundle, frames: list) -> np.ndarray:
    """D_k: each frame minus the footage it was drawn on, below every frame's face-box midline (int16): the
    mouth and chin, never the eyes (whose lids a blink at a phrase end lowers)."""
    boxes = np.asarray(bundle.boxes)
    x0, y0 = boxes[:, 0].min(), ((boxes[:, 1] + boxes[:, 3]) // 2).max()
    x1, y1 = boxes[:, 2].max(), boxes[:, 3].max()
    return np.stack(
        [
            f.image[y0:y1, x0:x1].astype(np.int16)
            - np.asarray(bundle.frames[f.base_index])[y0:y1, x0:x1].astype(np.int16)
            for f in frames
        ]
    )


def figures(bundle, frames: list, edge_frames: int) -> dict:
    """The largest one-frame step of the drawn mouth at each edge, and the median step inside the speech."""
    d = drawn_mouth(bundle, frames)
    step = np.r_[0.0, np.abs(np.diff(d, axis=0)).mean(axis=(1, 2, 3))]
    speaking = np.array([f.speaking for f in frames])
    first = int(np.argmax(speaking))
    last = len(speaking) - 1 - int(np.argmax(speaking[::-1]))
    window = max(edge_frames, 3) + 1  # the same frames on both sides (the default's easing frames and one)
    return {
        "start_max_step": round(float(step[first : first + window].max()), 2),
        "end_max_step": round(float(step[last + 1 : last + 1 + window].max()), 2),
        "speech_median_step": round(float(np.median(step[first + window : last + 1])), 2),
        "speech_p95_step": round(float(np.percentile(step[first + window : last + 1], 95)), 2),
        "frames_drawn_after_speech": int(np.abs(d[last + 1 :]).any(axis=(1, 2, 3)).sum()),
    }


def strip(path: Path, rows: list[tuple[str, object, list]]) -> None:
    """The mouth around the end of speech, one row per side, frames left to right, enlarged 2.5x."""
    lines = []
    for label, bundle, frames in rows:
        boxes = np.asarray(bundle.boxes)
        speaking = np.array([f.speaking for f in frames])
        last = len(speaking) - 1 - int(np.argmax(speaking[::-1]))
        tiles = []
        for f in frames[last - 1 : last + 6]:
            x0, y0, x1, y1 = (int(v) for v in boxes[f.base_index])
            top = y0 + (y1 - y0) * 55 // 100
            tile = cv2.resize(f.image[top:y1, x0:x1], None, fx=2.5, fy=2.5, interpolation=cv2.INTER_CUBIC)
            tag = "speech" if f.speaking else "idle"
            cv2.putText(tile, f"{f.index} {tag}", (6, 22), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (255, 255, 0), 2)
            tiles.append(tile)
        h = min(t.shape[0] for t in tiles)
        line = np.concatenate([t[:h] for t in tiles], axis=1)
        head = np.zeros((30, line.shape[1], 3), np.uint8)
        cv2.putText(head, label, (6, 21), cv2.FONT_HERSHEY_SIMPLEX, 0.65, (255, 255, 255), 2)
        lines.append(np.concatenate([head, line]))
    w = min(x.shape[1] for x in lines)
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), cv2.cvtColor(np.concatenate([x[:, :w] for x in lines]), cv2.COLOR_RGB2BGR))


def main(argv: list[str] | None = None) -> int:
    """Both sides on both avatars and both speeches; print and save the figures and the strip."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=RESULTS / "edges_bench.json")
    ap.add_argument("--strip", type=Path, default=REPO / "docs" / "img" / "utterance_edges.png")
    args = ap.parse_args(argv)

    from lipstream.audio.levels import SilenceDetector, frame_rms
    from lipstream.audio.timeline import SAMPLE_RATE, SAMPLES_PER_FRAME
    from lipstream.avatar.prepare import prepare_avatar
    from lipstream.avatar.sample import presenter_frame, write_sample_video
    from lipstream.engines.viseme.edges import EdgeConfig
    from lipstream.engines.viseme.engine import VisemeEngine
    from lipstream.talk.voices.espeak_tts import EspeakTTS

    work = Path(tempfile.mkdtemp(prefix="edges-bench-"))
    pcm = EspeakTTS("en-us").synthesize(TEXT).pcm.astype(np.float32)
    voiced = ~SilenceDetector().mask_from_levels(frame_rms(pcm))
    cut = (len(voiced) - int(np.argmax(voiced[::-1]))) * SAMPLES_PER_FRAME  # after the last voiced frame
    pause = np.zeros(int(0.3 * SAMPLE_RATE), np.float32)
    speeches = {"quiet ends": np.concatenate([pause, pcm, pause]), "cut at the last voice": pcm[:cut]}
    photo = work / "photo.png"
    cv2.imwrite(str(photo), cv2.cvtColor(presenter_frame(1080, 1920), cv2.COLOR_RGB2BGR))
    clip = work / "sample.mp4"
    write_sample_video(clip)
    avatars = {
        name: prepare_avatar(source, name, work / "avatars", progress=False)
        for name, source in (("sample", clip), ("photo", photo))
    }
    sides = {"one frame (before)": EdgeConfig(frames=0), "eased (after)": EdgeConfig()}
    engines = {side: VisemeEngine(edges=config) for side, config in sides.items()}
    results: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "cpu_model": cpu_model(), "cpus": os.cpu_count(),
        "edge_frames": EdgeConfig().frames, "cases": {},
    }  # fmt: skip
    looks = []
    for avatar, bundle in avatars.items():
        for speech, audio in speeches.items():
            case = results["cases"][f"{avatar}, {speech}"] = {}
            for side, engine in engines.items():
                frames = asyncio.run(live_frames(bundle, engine, audio))
                case[side] = figures(bundle, frames, engine.edges.frames)
                f = case[side]
                print(
                    f"{avatar:6s} {speech:22s} {side:20s} largest step at the start "
                    f"{f['start_max_step']:5.2f}, at the end {f['end_max_step']:5.2f}  "
                    f"(inside speech: median {f['speech_median_step']:4.2f}, p95 {f['speech_p95_step']:4.2f})"
                    f"  frames drawn after the speech {f['frames_drawn_after_speech']}"
                )
                if avatar == "sample" and speech == "quiet ends":
                    looks.append((f"sample, {side}", bundle, frames))
    strip(args.strip, looks)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {args.out}\nstrip: {args.strip}\nwork folder: {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

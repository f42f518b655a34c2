"""Eyes that blink (issue 22): blinks a minute in what a viewer sees, with and without drawn blinks.

Three avatars, each prepared twice in this run (blinks drawn and a photo breathing, and both off: the
behaviour before issue 22), then rendered from the same speech with the weight-free engine and re-tracked:

  photo        the astronaut photo on a 1080×1920 canvas (one picture)
  sample clip  `make demo`'s sample clip (the photo with a head bob; it never blinks by itself)
  own blinks   the sample clip with blinks drawn into its footage before prepare (a clip that blinks):
               prepare must keep its own and draw none

The "after" bundle renders twice: with the idle loop's blinks only, and with blinks at phrase ends too.

Per case and side: blinks found in the output (`find_blinks` on the re-tracked eye openness) per minute; the
eye openness outside blinks (its 5th percentile over the median: a dip that is not a blink shows here);
the share of found blinks starting within 0.8 s after a phrase end, beside the share of time such windows
cover (chance); the head's travel (the tracked nose bridge's 5-95th percentile span, px); prepare seconds.
Writes benchmarks/results/blink_bench.json and docs/img/blink_strip.png (the photo's first blink drawn at a
phrase end in the output, eyes enlarged, frame by frame).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/blink_bench.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np
from bench_common import cpu_model

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
TEXT = (
    "Good evening. Tonight the harbour bridge reopened after three weeks of repairs, and the first cars "
    "crossed it shortly before midnight. The mayor thanked the workers, who finished ahead of schedule. "
    "In other news, the museum will keep its doors open late on Fridays through the summer. "
)


def own_blink_clip(src: Path, dst: Path, starts: list[int]) -> None:
    """The clip at `src` with a 4-frame blink drawn at each of `starts` (a clip that blinks by itself)."""
    from lipstream.avatar.blink import BlinkConfig, blink_curve, close_eyes
    from lipstream.avatar.sample import encode_clip
    from lipstream.avatar.tracking import FaceTracker
    from lipstream.avatar.video_source import iter_frames, probe_video

    curve = blink_curve(0.16 * 25, BlinkConfig())
    closure = {s + k: float(c) for s in starts for k, c in enumerate(curve)}
    info = probe_video(src)

    def pictures():
        with FaceTracker() as tracker:
            for k, rgb in iter_frames(info):
                landmarks = tracker.track(rgb)
                amount = closure.get(k, 0.0)
                yield close_eyes(rgb, landmarks, amount) if amount and landmarks is not None else rgb

    encode_clip(dst, pictures(), fps=25)


def eye_track(mp4: Path) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """Eye openness per frame of a video (NaN: no face), the frames' eye regions (for the strip) and the
    nose bridge's position per frame (the head's motion)."""
    from lipstream.avatar.blink import eye_openness
    from lipstream.avatar.progress import frame_progress
    from lipstream.avatar.tracking import FaceTracker
    from lipstream.avatar.video_source import iter_frames, probe_video

    info = probe_video(mp4)
    openness = np.full(info.frame_count, np.nan)
    bridge = np.full((info.frame_count, 2), np.nan)
    eyes: list[np.ndarray] = []
    with (
        FaceTracker() as tracker,
        frame_progress(f"tracking eyes in {mp4.parent.name}", info.frame_count) as bar,
    ):
        for k, rgb in iter_frames(info):
            landmarks = tracker.track(rgb)
            if landmarks is not None:
                openness[k] = eye_openness(landmarks)
                bridge[k] = landmarks[6]
                corners = landmarks[[33, 263]]
                w = float(np.linalg.norm(corners[1] - corners[0]))
                cx, cy = corners.mean(axis=0)
                y0, x0 = int(cy - 0.3 * w), int(cx - 0.85 * w)
                eyes.append(np.array(rgb[max(y0, 0) : int(cy + 0.25 * w), max(x0, 0) : int(cx + 0.85 * w)]))
            else:
                eyes.append(np.zeros((8, 8, 3), np.uint8))
            bar()
    return openness, eyes, bridge


def measure(mp4: Path, seconds: float) -> tuple[dict, list[np.ndarray], list[tuple[int, int]]]:
    """Blinks a minute and the openness outside blinks, from the output alone."""
    from lipstream.avatar.blink import find_blinks

    openness, eyes, bridge = eye_track(mp4)
    valid = np.where(np.isnan(openness), np.nanmedian(openness), openness)
    found = find_blinks(valid, 25)
    outside = np.ones(len(valid), bool)
    for start, stop in found:
        outside[max(start - 2, 0) : stop + 2] = False
    median = float(np.median(valid[outside]))
    return (
        {
            "frames": len(valid),
            "faces_found": int(np.count_nonzero(~np.isnan(openness))),
            "blinks": len(found),
            "blinks_per_minute": round(60.0 * len(found) / seconds, 1),
            "blink_frames": [list(b) for b in found],
            "openness_median": round(median, 4),
            "openness_p5_outside_blinks_vs_median": round(
                float(np.percentile(valid[outside], 5)) / median, 3
            ),
            # the head's travel: the nose bridge's 5th-95th percentile span, pixels (x, y)
            "head_span_px": [
                round(float(np.ptp(np.nanpercentile(bridge[:, i], [5, 95]))), 1) for i in (0, 1)
            ],
        },
        eyes,
        found,
    )


def phrase_ends(speech, min_phrase_s: float = 0.8, pause_s: float = 0.2) -> list[int]:
    """Frames where a phrase ends in the speech: the first silent frame after >= min_phrase_s of voice that
    a pause of >= pause_s follows (the speech's own silence mask, as the renderer sees it)."""
    from lipstream.audio.levels import SilenceDetector

    silent = SilenceDetector().silent_mask(speech.pcm)
    ends, voiced, k = [], 0, 0
    while k < len(silent):
        if not silent[k]:
            voiced += 1
            k += 1
            continue
        run = k
        while run < len(silent) and silent[run]:
            run += 1
        if voiced >= min_phrase_s * 25 and run - k >= pause_s * 25:
            ends.append(k)
        if run - k >= pause_s * 25:
            voiced = 0
        k = run
    return ends


def phrase_end_figures(
    found: list[tuple[int, int]], ends: list[int], frames: int, window_s: float = 0.8
) -> dict:
    """The share of found blinks starting within `window_s` after a phrase end, beside the share of all
    frames such windows cover (what blinks at random times would show)."""
    window = np.zeros(frames, bool)
    for end in ends:
        window[end : end + int(window_s * 25)] = True
    at_ends = sum(1 for start, _ in found if start < frames and window[start])
    return {
        "phrase_ends": len(ends),
        "blinks_after_phrase_ends": round(at_ends / len(found), 3) if found else 0.0,
        "time_after_phrase_ends": round(float(window.mean()), 3),
    }


def lid_cost_ms(bundle, reps: int = 200) -> dict:
    """Compositing one frame at the avatar's size (I420, as the server streams it) with the lids lowered at
    render time and without, side by side (ms, medians of interleaved runs)."""
    from lipstream.render.compositor import Compositor

    compositor = Compositor(bundle)
    frame = int(bundle.idle_loop[0])
    out = np.empty_like(compositor.base.i420(frame))
    plain, lids = [], []
    for _ in range(reps):
        for amount, times in ((0.0, plain), (1.0, lids)):
            t0 = time.perf_counter()
            compositor.compose_i420(frame, None, out, lids=amount)
            times.append((time.perf_counter() - t0) * 1000.0)
    return {"plain_ms": round(float(np.median(plain)), 3), "lids_ms": round(float(np.median(lids)), 3)}


def strip(path: Path, eyes: list[np.ndarray], blink: tuple[int, int]) -> None:
    """The frames around one blink, eyes enlarged 3×, left to right."""
    start, stop = blink
    picked = [eyes[k] for k in range(max(start - 2, 0), min(stop + 3, len(eyes)))]
    h = min(p.shape[0] for p in picked)
    w = min(p.shape[1] for p in picked)
    row = np.concatenate(
        [np.pad(p[:h, :w], ((4, 4), (4, 4), (0, 0)), constant_values=255) for p in picked], axis=1
    )
    big = cv2.resize(row, None, fx=3, fy=3, interpolation=cv2.INTER_CUBIC)
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), cv2.cvtColor(big, cv2.COLOR_RGB2BGR))


def main() -> None:
    """Prepare, render and re-track every case on both sides; print and save the figures."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0, help="speech rendered per case")
    ap.add_argument("--out", type=Path, default=RESULTS / "blink_bench.json")
    ap.add_argument("--strip", type=Path, default=REPO / "docs" / "img" / "blink_strip.png")
    ap.add_argument("--cases", nargs="*", help="only these cases (photo, 'sample clip', 'own blinks')")
    args = ap.parse_args()

    from lipstream.audio.speech import Speech
    from lipstream.audio.timeline import SAMPLE_RATE
    from lipstream.avatar.blink import BlinkConfig
    from lipstream.avatar.breathing import BreathingConfig
    from lipstream.avatar.phrase_blinks import PhraseBlinkConfig
    from lipstream.avatar.prepare import PrepareConfig, prepare_avatar
    from lipstream.avatar.sample import presenter_frame, write_sample_video
    from lipstream.engines.viseme.engine import VisemeEngine
    from lipstream.render.offline import render_speech_to_mp4
    from lipstream.talk.espeak_tts import EspeakTTS

    work = Path(tempfile.mkdtemp(prefix="blink-bench-"))
    tts = EspeakTTS("en-us")
    pcm = np.zeros(0, np.float32)
    while len(pcm) < args.seconds * SAMPLE_RATE:
        pcm = np.concatenate([pcm, tts.synthesize(TEXT).pcm, np.zeros(SAMPLE_RATE // 2, np.float32)])
    speech = Speech(pcm=pcm[: int(args.seconds * SAMPLE_RATE)])
    photo = work / "photo.png"
    cv2.imwrite(str(photo), cv2.cvtColor(presenter_frame(1080, 1920), cv2.COLOR_RGB2BGR))
    clip = work / "sample.mp4"
    write_sample_video(clip)
    blinking = work / "blinking.mp4"
    own_starts = [30, 110, 170]  # frames: 1.2 s, 4.4 s and 6.8 s into the 8 s clip
    own_blink_clip(clip, blinking, own_starts)
    cases = {"photo": photo, "sample clip": clip, "own blinks": blinking}
    before = PrepareConfig(blink=BlinkConfig(enabled=False), breathing=BreathingConfig(False))
    off = PhraseBlinkConfig(enabled=False)
    sides = [  # the "after" bundle is prepared once and rendered without and with blinks at phrase ends
        ("before (no drawn blinks)", before, off),
        ("after, loop blinks only", PrepareConfig(), off),
        ("after, + blinks at phrase ends", PrepareConfig(), PhraseBlinkConfig()),
    ]
    prepared: dict = {}
    engine = VisemeEngine()
    results: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "cpu_model": cpu_model(), "cpus": os.cpu_count(),
        "seconds": args.seconds, "cases": {},
    }  # fmt: skip
    strip_done = False
    ends = phrase_ends(speech)
    for case, source in cases.items():
        if args.cases and case not in args.cases:
            continue
        results["cases"][case] = {}
        for side, config, phrase in sides:
            name = f"{case.replace(' ', '-')}-{'after' if config.blink.enabled else 'before'}"
            t0 = time.perf_counter()
            bundle = prepared.get(name)
            if bundle is None:
                bundle = prepare_avatar(source, name, work / "avatars", progress=False, config=config)
                prepared[name] = bundle
            prepare_s = time.perf_counter() - t0
            out = work / f"{name}-{len(results['cases'][case])}" / "out.mp4"
            out.parent.mkdir(parents=True)
            report = render_speech_to_mp4(
                bundle, engine, speech, out, persist_codebook=False, phrase_blinks=phrase
            )
            figures, eyes, found = measure(out, args.seconds)
            figures.update(
                prepare_s=round(prepare_s, 2), manifest_blinks=bundle.manifest.idle.get("blinks"),
                phrase_blinks_drawn=len(report.phrase_blinks), **phrase_end_figures(found, ends, len(eyes)),
            )  # fmt: skip
            results["cases"][case][side] = figures
            print(
                f"{case:12s} {side:34s} blinks/min {figures['blinks_per_minute']:5.1f}  "
                f"at phrase ends {figures['blinks_after_phrase_ends']:.2f} (time share "
                f"{figures['time_after_phrase_ends']:.2f})  "
                f"openness p5/median outside blinks {figures['openness_p5_outside_blinks_vs_median']:.3f}  "
                f"head span {figures['head_span_px']} px  prepare {prepare_s:.1f} s"
            )
            drawn_at_ends = [b for b in found if any(0 <= b[0] - k <= 10 for k in report.phrase_blinks)]
            if phrase.enabled:
                figures["compose_ms"] = lid_cost_ms(bundle)
                size = "x".join(str(v) for v in bundle.size)
                print(f"{case:12s} compositing a {size} frame (ms): {figures['compose_ms']}")
            if case == "photo" and drawn_at_ends and not strip_done:  # one drawn while speaking
                strip(args.strip, eyes, drawn_at_ends[0])
                strip_done = True
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {args.out}\nstrip: {args.strip}\nwork folder: {work}")


if __name__ == "__main__":
    main()

"""Eyes that blink (issues 22, 37): the blinks a face mesh finds in rendered speech, of the lipstream given.

The lipstream measured is the one on PYTHONPATH when the script starts (before_after: either tree). It
prepares two avatars with its own code (the loop's drawn blinks are made at prepare time) and renders the same
held-out espeak speech with the weight-free engine (blinks at phrase ends are decided at render time), in a
subprocess with PYTHONPATH pointing at its tree; the speech and the measures are this script's checkout's:

  photo        the astronaut photo on a 1080×1920 canvas (one picture: it breathes and blinks)
  sample clip  `make demo`'s sample clip (the photo with a head bob; it never blinks by itself)

Every figure is measured here, on the decoded MP4s, with a face mesh run over the output (eye openness =
lid gap / eye width; a frame is under the threshold below 0.55 of the median openness, shut below 0.3 of it;
a blink is a run of frames under the threshold of at most 0.5 s): blinks found a minute, the blinks drawn
(the loop's at the positions its manifest lists, and those decided at phrase ends) and how many of them the
mesh finds (a run of >= 2 frames under the threshold overlapping one), each found blink's frames under the
threshold and shut frames, the eye openness outside blinks (its 5th percentile over the median); and the cost
of compositing a frame with the lids lowered at render time. Writes benchmarks/results/blink_bench.json and
docs/img/blink_strip.png (a blink at a phrase end on the photo, eyes enlarged ×4, frame by frame; with
another --out, the strip goes beside it).

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks blink [--seconds 32]
    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks before_after --before REV -- blink   # two trees
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
STRIP = REPO / "docs" / "img" / "blink_strip.png"
TEXT = (  # held out: no test or other benchmark speaks it
    "The lighthouse keeper climbed the stairs at dusk, as he had every evening for thirty years. Below him "
    "the fishing boats turned for home. He lit the lamp, wrote one line in the log, and watched the first "
    "beam sweep across the water. "
)
SHUT = 0.3  # a frame under this share of the median openness counts as shut (the threshold is 0.55)


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


def measure(
    mp4: Path, seconds: float, drawn: list[int]
) -> tuple[dict, list[np.ndarray], list[tuple[int, int]]]:
    """Blinks the face mesh finds in the output, how long each reads shut, and which drawn blinks it finds."""
    from lipstream.avatar.blink import find_blinks

    openness, eyes, bridge = eye_track(mp4)
    valid = np.where(np.isnan(openness), np.nanmedian(openness), openness)
    found = find_blinks(valid, 25)  # runs under 0.55 of the median lasting at most 0.5 s
    median_all = float(np.median(valid))
    outside = np.ones(len(valid), bool)
    for start, stop in found:
        outside[max(start - 2, 0) : stop + 2] = False
    median = float(np.median(valid[outside]))
    under = [stop - start for start, stop in found]
    shut = [int(np.count_nonzero(valid[start:stop] < SHUT * median_all)) for start, stop in found]
    seen = [k for k in drawn if any(b - a >= 2 and a < k + 9 and b > k for a, b in found)]
    return (
        {
            "frames": len(valid),
            "faces_found": int(np.count_nonzero(~np.isnan(openness))),
            "blinks": len(found),
            "blinks_per_minute": round(60.0 * len(found) / seconds, 1),
            "blink_frames": [list(b) for b in found],
            "frames_under_threshold": under,
            "frames_under_threshold_median": float(np.median(under)) if under else 0.0,
            "shut_frames": shut,
            "shut_frames_median": float(np.median(shut)) if shut else 0.0,
            "drawn_blinks": len(drawn),
            "drawn_found_2_frames": len(seen),
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


def strip(path: Path, rows: list[tuple[str, list[np.ndarray], tuple[int, int]]]) -> None:
    """The frames around one blink per row, eyes enlarged 4×, left to right, labelled."""
    cells = []
    for label, eyes, (start, stop) in rows:
        picked = [eyes[k] for k in range(max(start - 2, 0), min(stop + 3, len(eyes)))][:11]
        cells.append((label, picked))
    h = min(p.shape[0] for _, picked in cells for p in picked)
    w = min(p.shape[1] for _, picked in cells for p in picked)
    width = max(len(picked) for _, picked in cells) * (w + 8)
    lines = []
    for label, picked in cells:
        row = np.concatenate(
            [np.pad(p[:h, :w], ((4, 4), (4, 4), (0, 0)), constant_values=255) for p in picked], axis=1
        )
        row = np.pad(row, ((0, 0), (0, width - row.shape[1]), (0, 0)), constant_values=255)
        big = cv2.resize(row, None, fx=4, fy=4, interpolation=cv2.INTER_CUBIC)
        title = np.full((28, big.shape[1], 3), 255, np.uint8)
        cv2.putText(title, label, (6, 20), cv2.FONT_HERSHEY_SIMPLEX, 0.6, (0, 0, 0), 1)
        lines += [title, big]
    path.parent.mkdir(parents=True, exist_ok=True)
    cv2.imwrite(str(path), cv2.cvtColor(np.concatenate(lines, axis=0), cv2.COLOR_RGB2BGR))


def worker(spec_path: Path) -> None:
    """Prepare one avatar, render the speech with the `lipstream` PYTHONPATH gives; write what it drew."""
    from lipstream.audio.speech import Speech
    from lipstream.avatar.prepare import prepare_avatar
    from lipstream.engines.viseme.engine import VisemeEngine
    from lipstream.render.offline import render_speech_to_mp4

    spec = json.loads(spec_path.read_text())
    out = Path(spec["out"])
    t0 = time.perf_counter()
    bundle = prepare_avatar(Path(spec["source"]), spec["name"], Path(spec["avatars"]), progress=False)
    prepare_s = time.perf_counter() - t0
    speech = Speech(pcm=np.load(spec["speech"])["pcm"])
    report = render_speech_to_mp4(bundle, VisemeEngine(), speech, out / "out.mp4", persist_codebook=False)
    loop = len(bundle.idle_loop)
    frames = len(speech.pcm) * 25 // 16000
    starts = set(bundle.manifest.drawn_blink_starts() or [])
    drawn = sorted({k for k in range(frames) if k % loop in starts} | set(report.phrase_blinks))
    import lipstream

    result = {
        "lipstream": lipstream.__file__, "bundle": str(bundle.path), "prepare_s": round(prepare_s, 2),
        "loop_frames": loop,
        "manifest_blinks": bundle.manifest.idle.get("blinks"), "phrase_blinks": list(report.phrase_blinks),
        "drawn_starts": drawn, "compose_ms": lid_cost_ms(bundle),
    }  # fmt: skip
    (out / "result.json").write_text(json.dumps(result, indent=2))


def run_side(checkout: Path, spec: dict, work: Path) -> dict:
    """One avatar in a subprocess whose `lipstream` is the checkout's."""
    spec_path = work / f"spec-{os.getpid()}.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    script = Path(__file__).resolve()
    subprocess.run(
        [sys.executable, str(script), "--worker", str(spec_path)], cwd=checkout, env=env, check=True
    )
    result = json.loads((Path(spec["out"]) / "result.json").read_text())
    if not result["lipstream"].startswith(str(checkout)):  # the side must run its own code
        raise RuntimeError(f"the worker for {checkout} imported {result['lipstream']}")
    return result


def main(argv: list[str] | None = None) -> int:
    """Prepare, render and re-track both avatars with the lipstream given; print and save the figures."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--seconds", type=float, default=32.0, help="speech rendered per avatar")
    ap.add_argument("--out", type=Path, default=RESULTS / "blink_bench.json")
    ap.add_argument("--strip", type=Path, default=STRIP)
    ap.add_argument("--cases", nargs="*", help="only these avatars (photo, 'sample clip')")
    args = ap.parse_args(argv)
    if args.worker:
        worker(args.worker)
        return 0
    if args.out != RESULTS / "blink_bench.json" and args.strip == STRIP:
        args.strip = args.out.with_suffix(".png")  # writing elsewhere (before_after): the docs' strip stays
    # the lipstream measured: the one PYTHONPATH names, found without importing it; the speech and the
    # measures are made with this script's checkout
    tree = Path(importlib.util.find_spec("lipstream").origin).resolve().parent.parent
    sys.path.insert(0, str(REPO))

    # (imported here, not at the top: the worker must import the lipstream its PYTHONPATH names)
    from bench_common import cpu_model

    from lipstream.audio.timeline import SAMPLE_RATE
    from lipstream.avatar.sample import presenter_frame, write_sample_video
    from lipstream.talk.voices.espeak_tts import EspeakTTS

    work = Path(tempfile.mkdtemp(prefix="blink-bench-"))
    tts = EspeakTTS("en-gb-scotland")  # a voice and a text the project's tests never used
    pcm = np.zeros(0, np.float32)
    while len(pcm) < args.seconds * SAMPLE_RATE:
        pcm = np.concatenate([pcm, tts.synthesize(TEXT).pcm, np.zeros(SAMPLE_RATE // 2, np.float32)])
    np.savez(work / "speech.npz", pcm=pcm[: int(args.seconds * SAMPLE_RATE)])
    photo = work / "photo.png"
    cv2.imwrite(str(photo), cv2.cvtColor(presenter_frame(1080, 1920), cv2.COLOR_RGB2BGR))
    clip = work / "sample.mp4"
    write_sample_video(clip)
    cases = {"photo": photo, "sample clip": clip}
    results: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M"), "cpu_model": cpu_model(), "cpus": os.cpu_count(),
        "seconds": args.seconds, "lipstream": str(tree), "shut_below": SHUT, "cases": {},
    }  # fmt: skip
    strip_rows = []
    for case, source in cases.items():
        if args.cases and case not in args.cases:
            continue
        out = work / case.replace(" ", "-")
        out.mkdir(parents=True)
        spec = {
            "source": str(source), "name": case.replace(" ", "-"), "avatars": str(out / "avatars"),
            "speech": str(work / "speech.npz"), "out": str(out),
        }  # fmt: skip
        drew = run_side(tree, spec, work)
        figures, eyes, found = measure(out / "out.mp4", args.seconds, drew["drawn_starts"])
        figures.update(drew)
        results["cases"][case] = figures
        at_phrase = [b for b in found if any(0 <= b[0] - k <= 10 for k in drew["phrase_blinks"])]
        if case == "photo" and (at_phrase or found):
            strip_rows.append((str(tree), eyes, (at_phrase or found)[0]))
        print(f"\n{case}:")
        for key in ("blinks_per_minute", "drawn_blinks", "drawn_found_2_frames",
                    "frames_under_threshold_median", "shut_frames_median",
                    "openness_p5_outside_blinks_vs_median", "prepare_s", "frames_under_threshold",
                    "shut_frames", "compose_ms"):  # fmt: skip
            print(f"  {key:44s} {figures[key]!s:>14s}")
    if strip_rows:
        strip(args.strip, strip_rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {args.out}\nstrip: {args.strip}\nwork folder: {work}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

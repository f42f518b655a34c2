"""Weight-free mouth realism (issues 13, 22): the engine before and after, side by side in one run.

"before" is the viseme engine at an older commit (`--before`, via `git worktree add`), "after" is this
checkout; each renders in its own subprocess with PYTHONPATH pointing at its checkout, on its own view of
the same avatar (a folder of symlinks to the prepared frames with its own engine caches, so neither
touches $LIPSTREAM_HOME). Every figure is measured here, with this checkout's code, on the decoded MP4s:

  speed      engine ms per frame (features + render, every frame) and render realtime factor
  lip-sync   `measure_lipsync` (the code behind `lipstream eval lipsync`): envelope r, silent frames closed;
             p/b/m closed: frames inside a TTS p/b/m phoneme whose tracked aperture is under the closed line
             f/v: median tracked aperture of frames inside a TTS f/v phoneme over the median of the
             avatar's own frames (its rest mouth; the lower lip against the upper teeth reads below 1)
  flat fill  luminance spread of the darker half of the tracked inner-lip region, frames most open (top 10 %)
  re-track   tracked inner-lip opening vs the engine's intended opening (r); lower-lip thickness tracked on
             the output / the source frame's, per opening bin (min over bins)
  amplitude  (issue 22) inner-lip gap (face mesh 13/14) / mouth width (61/291) over speaking (non-silent)
             frames: median and 95th percentile (human speech: median 0.10-0.22, p95 <= 0.40); the jaw:
             Pearson r of the chin-to-nose-tip distance (152 to 1) with that opening over speaking frames,
             and the chin's drop over the lower lip's (14) on open frames (speaking, at or above the median
             opening) against closed ones (under the lip-sync closed line); both distances in eye widths
             minus the source frame's, so the idle loop's head motion cancels
  chin (re-tracked, issue 37) the same drops measured against the same base frames re-tracked from a render of
             silence (the idle frames as shown, through the same encoder and face mesh) instead of against the
             bundle's own prepare-time landmarks: per speaking frame at or above the median opening, chin and
             lower lip moved this far down from where the mesh sees them at rest on that very frame; the
             median chin drop over the median lip drop (chin_over_lip_retracked) and the least-squares slope
             of chin on lip over all speaking frames (chin_on_lip_slope_retracked); and the drops as the
             picture's rows, pixels down from the rest frame's (chin_over_lip_px: the issue's measure; the
             nose-tip distances read higher because the mesh moves the nose tip and the eye width with the
             mouth although the warp never moves a pixel at or above the nose base)
  width      (issue 22 item 2) the tracked mouth's corner-to-corner width (61/291, eye widths) minus the
             source frame's, median over ee frames and over oo frames (TTS phonemes), and the ee/oo ratio of
             the width over the source frame's (a spread ee wider than a rounded oo: > 1)
  nose       largest change of any patch pixel at or above the nose base (must be 0)
  atlas      a talking clip made here (the sample avatar rendered with this checkout's drawn mouth from
             espeak speech, then prepared as an avatar) rendered from its own audio: mouth-region PSNR/SSIM
             of the patches against the filmed crops, and opening r of output vs the clip (both tracked)

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/realism_bench.py [--before f70cc2d] [--seconds 20]
  --case espeak    the held-out espeak speech on the sample and on the photo only (issue 37's check); the
                   before side is a worktree of --before made for this run and removed after it

  --case talking   only the cases whose name contains "talking" (the atlas path; the others are skipped,
                   not changed); results then go to realism_bench_<case>.json, the sheet to the work folder
  --drawn-too      a third side, "after-drawn": this checkout with mouth=drawn, on the same clip

Writes benchmarks/results/realism_bench.json and docs/img/mouth_contact_sheet.png.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
PIPER_TEXT = (
    "Good evening. Tonight the harbour bridge reopened after three weeks of repairs, and the first cars "
    "crossed it shortly before midnight. The mayor thanked the workers, who finished ahead of schedule. "
    "In other news, the museum will keep its doors open late on Fridays through the summer."
)
TALKING_TEXT = (
    "Maybe the weather will be warmer on Thursday, said Bob. Five wide blue moons rose over the sea. "
    "Father saw a very big balloon above the park, and we all laughed."
)
ESPEAK_VOICE = "en-gb-scotland"
# Contact-sheet classes: TTS phonemes (stress and length marks stripped) that show each mouth.
CLASSES = {
    "closed": (),
    "p/b/m": ("p", "b", "m"),
    "ah": ("a", "ɑ", "æ", "aɪ", "aʊ", "ɐ"),
    "ee": ("i", "iː"),
    "oo": ("u", "uː", "ʊ"),
    "f/v": ("f", "v"),
}


@dataclass(frozen=True)
class Case:
    """One rendered video per side."""

    name: str
    avatar: str  # "sample", "photo" (the sample's picture as a one-photo avatar: breathing) or "talking"
    voice: str
    use_phonemes: bool
    fidelity: bool = False  # render on the clip's own frames and compare with them


CASES = (
    Case("sample piper timings", "sample", "piper", True),
    Case("sample espeak audio-only", "sample", "espeak", False),
    Case("photo piper timings", "photo", "piper", True),
    Case("photo espeak audio-only", "photo", "espeak", False),
    Case("talking clip, own audio", "talking", "espeak-talking", True, fidelity=True),
)


# ---------------------------------------------------------------- worker (runs inside either checkout)
def worker(spec_path: Path) -> None:
    """Render one case with whatever `lipstream` PYTHONPATH gives, and time it."""
    import cv2

    import lipstream
    from lipstream.audio.speech import PhonemeTiming
    from lipstream.avatar.bundle import load_avatar
    from lipstream.engines.base import Speech
    from lipstream.engines.viseme.engine import VisemeEngine
    from lipstream.render.offline import render_speech_to_mp4

    sys.path.insert(0, str(REPO / "benchmarks"))
    from lipsync_bench import hot_path_ms

    spec = json.loads(spec_path.read_text())
    out = Path(spec["out"])
    z = np.load(spec["speech"], allow_pickle=False)
    phonemes = [
        PhonemeTiming(str(p), int(s), int(e)) for p, s, e in zip(z["ph"], z["start"], z["end"], strict=True)
    ]
    speech = Speech(z["pcm"], phonemes=phonemes if spec["use_phonemes"] else None, text=str(z["text"]))
    bundle = load_avatar(spec["avatar"])
    # "mouth" only when asked (--drawn-too): the before checkout's engine may not take it.
    extra = {"mouth": spec["mouth"]} if spec.get("mouth") else {}
    engine = VisemeEngine(use_phonemes=spec["use_phonemes"], **extra)
    t0 = time.perf_counter()
    engine.prepare(bundle)
    prepare_s = time.perf_counter() - t0
    hot_path_ms(engine, bundle, speech)  # warm caches
    speed = hot_path_ms(engine, bundle, speech)
    load = [os.getloadavg()[0]]
    report = render_speech_to_mp4(bundle, engine, speech, out / "out.mp4", persist_codebook=False)
    load.append(os.getloadavg()[0])
    feats = engine.features(speech)
    n = len(feats)
    ids = bundle.base_frame_indices(0, n)
    cache = engine._cache(bundle)
    # Nothing at or above the nose base changes: every patch against its base crop.
    nose_diff = 0
    patches = np.empty((n, *cache.crops.shape[1:]), np.uint8)
    for s in range(0, n, engine.batch_size):
        patches[s : s + engine.batch_size] = engine.render(
            bundle, feats[s : s + engine.batch_size], ids[s : s + engine.batch_size]
        )
    for k in range(n):
        row = int(np.floor(bundle.nose_base[ids[k]])) + 1
        crop = np.asarray(cache.crops[ids[k]])
        nose_diff = max(nose_diff, int(np.abs(patches[k, :row].astype(int) - crop[:row]).max()))
    result = {
        "lipstream": lipstream.__file__,
        "prepare_s": round(prepare_s, 2),
        **{k: round(v, 3) for k, v in speed.items()},
        "realtime_factor": report.realtime_factor,
        "stage_ms": report.stage_ms,
        "notes": list(getattr(report, "notes", []) or []),
        "mouth_source": engine.mouth_source(bundle) if hasattr(engine, "mouth_source") else "mouth: drawn",
        "nose_max_change": nose_diff,
        "load_average": [round(v, 2) for v in load],
        "frames": n,
        "idle_loop_is_identity": bool(np.array_equal(ids, np.arange(n))),
    }
    if spec["fidelity"]:
        # Rendered on the clip's own frames (frame k under audio frame k): how close to what was filmed.
        m = min(n, bundle.frame_count)
        own = np.arange(m)
        mine = np.empty((m, *cache.crops.shape[1:]), np.uint8)
        for s in range(0, m, engine.batch_size):
            mine[s : s + engine.batch_size] = engine.render(
                bundle, feats[s : s + engine.batch_size], own[s : s + engine.batch_size]
            )
        crops = np.stack([np.asarray(cache.crops[i]) for i in range(m)])  # format 2: crops made per frame
        masks = np.stack([np.asarray(bundle.masks[i]) for i in range(m)]) > 128
        speaking = feats[:m].any(axis=1)
        diff = (mine.astype(np.float64) - crops) ** 2
        mse = float(diff[masks & speaking[:, None, None]].mean())
        result["fidelity_psnr_db"] = round(10 * np.log10(255.0**2 / max(mse, 1e-9)), 2)
        result["fidelity_ssim"] = round(_mouth_ssim(cv2, mine, crops, masks, speaking), 4)
        result["fidelity_frames"] = int(speaking.sum())
    np.savez(out / "features.npz", features=feats, ids=ids)
    (out / "result.json").write_text(json.dumps(result, indent=2))


def _mouth_ssim(cv2, a: np.ndarray, b: np.ndarray, masks: np.ndarray, use: np.ndarray) -> float:
    """Mean SSIM (grey, Gaussian window 11/1.5) over the mouth-mask box of each used frame."""
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2
    values = []
    for k in np.flatnonzero(use):
        ys, xs = np.nonzero(masks[k])
        if ys.size == 0:
            continue
        sl = (slice(ys.min(), ys.max() + 1), slice(xs.min(), xs.max() + 1))
        x = cv2.cvtColor(a[k], cv2.COLOR_RGB2GRAY)[sl].astype(np.float64)
        y = cv2.cvtColor(b[k], cv2.COLOR_RGB2GRAY)[sl].astype(np.float64)

        def blur(v):
            return cv2.GaussianBlur(v, (11, 11), 1.5)

        mx, my = blur(x), blur(y)
        sxx, syy, sxy = blur(x * x) - mx * mx, blur(y * y) - my * my, blur(x * y) - mx * my
        s = ((2 * mx * my + c1) * (2 * sxy + c2)) / ((mx * mx + my * my + c1) * (sxx + syy + c2))
        values.append(float(s[masks[k][sl]].mean()))
    return float(np.mean(values)) if values else float("nan")


# ---------------------------------------------------------------- parent (this checkout)
def avatar_view(src: Path, dst: Path) -> Path:
    """A bundle folder that shares `src`'s prepared arrays (symlinks) but has its own manifest and caches."""
    dst.mkdir(parents=True)
    for item in src.iterdir():
        if item.name in ("manifest.json", "engines", "cache"):
            continue
        (dst / item.name).symlink_to(item.resolve())
    manifest = json.loads((src / "manifest.json").read_text())
    manifest["engines"] = {}
    (dst / "manifest.json").write_text(json.dumps(manifest, indent=2))
    if (src / "cache").is_dir():  # the compositor's I420 frames: prepare-time work, shared read-only
        (dst / "cache").mkdir()
        for item in (src / "cache").glob("frames_i420_*.npy"):
            if item.stat().st_size < 2e9:
                (dst / "cache" / item.name).symlink_to(item.resolve())
    return dst


def save_speech(speech, path: Path, seconds: float | None = None) -> None:
    """PCM, text and phoneme timings in one .npz both checkouts can read."""
    from lipstream.audio.timeline import SAMPLE_RATE

    n = len(speech.pcm) if seconds is None else min(len(speech.pcm), int(seconds * SAMPLE_RATE))
    phonemes = [p for p in speech.phonemes or [] if p.start < n]
    np.savez(
        path,
        pcm=np.asarray(speech.pcm[:n], np.float32),
        ph=np.array([p.phoneme for p in phonemes], dtype=str),
        start=np.array([p.start for p in phonemes], np.int64),
        end=np.array([min(p.end, n) for p in phonemes], np.int64),
        text=np.array(speech.text or ""),
    )


def frame_classes(z, n: int) -> dict[str, np.ndarray]:
    """Boolean mask of frames per contact-sheet class, from the TTS phonemes (frame centre in the phoneme)."""
    from lipstream.audio.timeline import SAMPLES_PER_FRAME

    centres = (np.arange(n) + 0.5) * SAMPLES_PER_FRAME
    out = {}
    for name, symbols in CLASSES.items():
        mask = np.zeros(n, bool)
        for p, s, e in zip(z["ph"], z["start"], z["end"], strict=True):
            if str(p).strip("ˈˌː") in symbols:
                mask |= (centres >= s) & (centres < e)
        out[name] = mask
    return out


def pick_frames(classes: dict[str, np.ndarray], opening: np.ndarray) -> dict[str, int]:
    """One frame per class: the most open vowel frame, the middle of the longest consonant run, a rest."""
    picks = {}
    for name, mask in classes.items():
        if name == "closed":
            rest = opening <= 1e-4
            rest[: max(int(np.argmax(opening > 0)), 1)] = False  # after the first word
            mask = rest
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            continue
        if name in ("ah", "ee", "oo"):
            picks[name] = int(idx[np.argmax(opening[idx])])
        else:
            runs = np.split(idx, np.flatnonzero(np.diff(idx) > 1) + 1)
            longest = max(runs, key=len)
            picks[name] = int(longest[len(longest) // 2])
    return picks


def _source_rest_aperture(bundle) -> float:
    """Median tracked inner-lip aperture of the avatar's own frames (its rest mouth), in eye widths."""
    from lipstream.avatar.face_measures import lip_aperture

    return float(np.median([lip_aperture(np.asarray(landmarks)) for landmarks in bundle.landmarks]))


def measure_video(
    mp4: Path, features: np.ndarray, ids: np.ndarray, bundle, z, keep: set[int], reference: list | None = None
) -> dict:
    """Lip-sync, flat fill, re-tracking and p/b/m figures of one output video; mouth crops of `keep`.
    `reference`: the mesh's landmarks of the same base frames at rest (a render of silence), per frame."""
    from lipstream.engines.viseme.articulation import CLOSURE, OPEN
    from lipstream.evaluation.lipsync import measure_lipsync
    from lipstream.evaluation.mouth_realism import RecordingTracker, darker_half_spread, lower_lip_thickness

    rec = RecordingTracker(keep_frames=keep, crop_half=int(0.3 * bundle.manifest.face_width_px))
    try:
        report, _, aperture, silent = measure_lipsync(mp4, progress=False, tracker=rec)
    finally:
        rec.close()
    n = min(len(aperture), len(features))
    aperture = aperture[:n]
    intended = features[:n, OPEN] * (1 - np.clip(features[:n, CLOSURE], 0, 1))
    found = np.isfinite(aperture)
    # Flat fill: the frames whose tracked mouth is most open (top 10 % of the speaking frames).
    speaking = found & (intended > 0)
    top = np.flatnonzero(speaking)[np.argsort(aperture[speaking])[::-1]][: max(int(0.1 * speaking.sum()), 3)]
    spreads = [darker_half_spread(rec.mouth_luma[k]) for k in top]
    spreads = [s for s in spreads if np.isfinite(s)]
    whole = [float(rec.mouth_luma[k].std()) for k in top if rec.mouth_luma[k].size >= 8]
    r_open = float(np.corrcoef(aperture[found], intended[found])[0, 1])
    # Lower lip: tracked on the output / the source frame it was drawn on, per opening bin.
    ratios = np.full(n, np.nan)
    for k in np.flatnonzero(found):
        lm = rec.landmarks[k]
        if lm is not None:
            ratios[k] = lower_lip_thickness(lm) / lower_lip_thickness(np.asarray(bundle.landmarks[ids[k]]))
    bins = {}
    for lo in np.arange(0.0, 1.0, 0.2):
        sel = np.isfinite(ratios) & (intended >= lo) & (intended < lo + 0.2 if lo < 0.8 else intended <= 1.0)
        if lo == 0.0:
            sel &= intended > 0
        if sel.sum() >= 5:
            bins[f"{lo:.1f}-{lo + 0.2:.1f}"] = round(float(np.median(ratios[sel])), 3)
    classes = frame_classes(z, n)
    pbm = classes["p/b/m"] & found
    # f/v: the lower lip against the upper teeth reads as a smaller inner-lip gap than the rest mouth's
    fv = classes["f/v"] & found
    return {
        "lipsync": report.as_dict(),
        "pbm_frames": int(pbm.sum()),
        "pbm_closed_share": round(float(np.mean(aperture[pbm] <= report.closed_threshold)), 3)
        if pbm.any()
        else None,
        "fv_frames": int(fv.sum()),
        "fv_aperture_vs_source_rest": round(float(np.median(aperture[fv]) / _source_rest_aperture(bundle)), 3)
        if fv.any()
        else None,
        "flat_fill_darker_half_std": round(float(np.median(spreads)), 2) if spreads else None,
        "flat_fill_whole_std": round(float(np.median(whole)), 2) if whole else None,
        "flat_fill_frames": len(spreads),
        "retrack_opening_r": round(r_open, 3),
        **amplitude_figures(
            rec.landmarks[:n], bundle, ids[:n], ~np.asarray(silent[:n], bool), aperture, report
        ),
        **(
            retracked_chin_figures(rec.landmarks[:n], reference[:n], ~np.asarray(silent[:n], bool))
            if reference is not None
            else {}
        ),
        **width_figures(rec.landmarks[:n], bundle, ids[:n], classes),
        "lower_lip_ratio_by_opening": bins,
        "lower_lip_ratio_min": min(bins.values()) if bins else None,
        "aperture": aperture.tolist(),
        "_crops": rec.crops,
    }


CHIN, NOSE_TIP, LOWER_LIP_MID = 152, 1, 14


def _vertical_offsets(landmarks, bundle, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per frame: inner-lip gap / mouth width, and the chin's and the lower lip's distance from the nose
    tip (eye widths) minus the source frame's (so the idle loop's head motion cancels); NaN if not found."""
    from lipstream.avatar.face_measures import eye_width, gap_over_width

    n = len(landmarks)
    ratio, chin, lip = (np.full(n, np.nan) for _ in range(3))
    for k, lm in enumerate(landmarks):
        if lm is None:
            continue
        src = np.asarray(bundle.landmarks[ids[k]], np.float32)
        ratio[k] = gap_over_width(lm)

        def dist(a, point):
            return float(np.linalg.norm(a[point] - a[NOSE_TIP]) / eye_width(a))

        chin[k] = dist(lm, CHIN) - dist(src, CHIN)
        lip[k] = dist(lm, LOWER_LIP_MID) - dist(src, LOWER_LIP_MID)
    return ratio, chin, lip


def amplitude_figures(
    landmarks, bundle, ids: np.ndarray, speaking: np.ndarray, aperture: np.ndarray, report
) -> dict:
    """Issue 22: the opening at human amplitude (gap / width over speaking frames) and the jaw carrying it
    (chin-to-nose distance against the opening; the chin's drop over the lower lip's, open vs closed)."""
    ratio, chin, lip = _vertical_offsets(landmarks, bundle, ids)
    ok = np.isfinite(ratio)
    talk = ok & speaking
    if talk.sum() < 5:
        return {}
    closed = ok & (aperture <= report.closed_threshold)
    # open: speaking frames at or above the speaking median's opening
    opened = talk & (ratio >= np.median(ratio[talk]))
    lip_drop = float(np.median(lip[opened]) - np.median(lip[closed])) if closed.any() else float("nan")
    chin_drop = float(np.median(chin[opened]) - np.median(chin[closed])) if closed.any() else float("nan")
    return {
        "gap_over_width_median": round(float(np.median(ratio[talk])), 3),
        "gap_over_width_p95": round(float(np.percentile(ratio[talk], 95)), 3),
        "gap_over_width_frames": int(talk.sum()),
        "chin_opening_r": round(float(np.corrcoef(chin[talk], ratio[talk])[0, 1]), 3),
        "lower_lip_drop_eye_widths": round(lip_drop, 4),
        "chin_drop_eye_widths": round(chin_drop, 4),
        "chin_over_lip_drop": round(chin_drop / lip_drop, 3) if lip_drop > 1e-4 else None,
    }


def retracked_chin_figures(landmarks, reference, speaking: np.ndarray) -> dict:
    """Issue 37: the chin's and the lower lip's drop from where the face mesh sees them at rest on the same
    base frame (both re-tracked from rendered video), eye widths from the nose tip, over speaking frames."""
    from lipstream.avatar.face_measures import eye_width, gap_over_width

    n = min(len(landmarks), len(reference), len(speaking))
    ratio, chin, lip, chin_px, lip_px = (np.full(n, np.nan) for _ in range(5))
    for k in range(n):
        lm, ref = landmarks[k], reference[k]
        if lm is None or ref is None:
            continue

        def dist(a, point):
            return float(np.linalg.norm(a[point] - a[NOSE_TIP]) / eye_width(a))

        ratio[k] = gap_over_width(lm)
        chin[k] = dist(lm, CHIN) - dist(ref, CHIN)
        lip[k] = dist(lm, LOWER_LIP_MID) - dist(ref, LOWER_LIP_MID)
        # the same drops as the picture's rows (pixels down from the rest frame's): no nose tip, no eye width
        chin_px[k] = float(lm[CHIN, 1] - ref[CHIN, 1])
        lip_px[k] = float(lm[LOWER_LIP_MID, 1] - ref[LOWER_LIP_MID, 1])
    talk = np.isfinite(ratio) & speaking[:n]
    if talk.sum() < 5:
        return {}
    opened = talk & (ratio >= np.median(ratio[talk]))
    lip_drop, chin_drop = float(np.median(lip[opened])), float(np.median(chin[opened]))
    slope = float(np.polyfit(lip[talk], chin[talk], 1)[0])
    lip_rows, chin_rows = float(np.median(lip_px[opened])), float(np.median(chin_px[opened]))
    return {
        "lower_lip_drop_px": round(lip_rows, 2),
        "chin_drop_px": round(chin_rows, 2),
        "chin_over_lip_px": round(chin_rows / lip_rows, 3) if lip_rows > 1e-3 else None,
        "lower_lip_drop_retracked": round(lip_drop, 4),
        "chin_drop_retracked": round(chin_drop, 4),
        "chin_over_lip_retracked": round(chin_drop / lip_drop, 3) if lip_drop > 1e-4 else None,
        "chin_on_lip_slope_retracked": round(slope, 3),
    }


def rest_landmarks(bundle_path: Path, frames: int, work: Path) -> list:
    """The face mesh's landmarks of the first `frames` output frames of a render of silence (the base frames
    as shown, through the same compositor, encoder and decoder as speech)."""
    from lipstream.audio.timeline import SAMPLES_PER_FRAME
    from lipstream.avatar.bundle import load_avatar
    from lipstream.avatar.tracking import FaceTracker
    from lipstream.engines.base import Speech
    from lipstream.engines.viseme.engine import VisemeEngine
    from lipstream.evaluation.lipsync import video_apertures
    from lipstream.render.offline import render_speech_to_mp4

    out = work / "rest.mp4"
    silence = Speech(np.zeros(frames * SAMPLES_PER_FRAME, np.float32))
    render_speech_to_mp4(load_avatar(bundle_path), VisemeEngine(), silence, out, persist_codebook=False)
    found: list = []

    class Keep(FaceTracker):
        def track(self, frame_rgb):
            lm = super().track(frame_rgb)
            found.append(None if lm is None else np.asarray(lm, np.float32))
            return lm

    tracker = Keep()
    try:
        video_apertures(out, False, tracker)
    finally:
        tracker.close()
    return found


MOUTH_LEFT, MOUTH_RIGHT = 61, 291


def width_figures(landmarks, bundle, ids: np.ndarray, classes: dict[str, np.ndarray]) -> dict:
    """Issue 22 item 2: the tracked mouth's corner-to-corner width (61/291, eye widths) minus the source
    frame's on ee and on oo frames, and the ee/oo ratio of width over the source's (spread vs round)."""
    from lipstream.avatar.face_measures import eye_width

    def width(a) -> float:
        return float(np.linalg.norm(a[MOUTH_RIGHT] - a[MOUTH_LEFT]) / eye_width(a))

    out, rel = {}, {}
    for name in ("ee", "oo"):
        delta, ratio = [], []
        for k in np.flatnonzero(classes[name][: len(landmarks)]):
            if landmarks[k] is None:
                continue
            w_src = width(np.asarray(bundle.landmarks[ids[k]], np.float32))
            w_out = width(np.asarray(landmarks[k], np.float32))
            delta.append(w_out - w_src)
            ratio.append(w_out / w_src)
        out[f"{name}_frames"] = len(delta)
        out[f"{name}_width_change_eye_widths"] = round(float(np.median(delta)), 4) if delta else None
        rel[name] = float(np.median(ratio)) if ratio else float("nan")
    out["ee_oo_width_ratio"] = round(rel["ee"] / rel["oo"], 3) if np.isfinite(rel["ee"] / rel["oo"]) else None
    return out


def contact_sheet(path: Path, rows: list[tuple[str, dict[str, int], dict]], cell: int = 200) -> None:
    """Rows of enlarged mouth crops, one column per class, labelled."""
    import cv2

    names = list(CLASSES)
    label_w, head = 230, 34
    sheet = np.full((head + cell * len(rows), label_w + cell * len(names), 3), 255, np.uint8)
    for j, name in enumerate(names):
        cv2.putText(sheet, name, (label_w + j * cell + 8, 24), cv2.FONT_HERSHEY_SIMPLEX, 0.7, (0, 0, 0), 2)
    for i, (label, picks, crops) in enumerate(rows):
        y = head + i * cell
        for t, line in enumerate(label.split("\n")):
            cv2.putText(sheet, line, (6, y + 40 + 24 * t), cv2.FONT_HERSHEY_SIMPLEX, 0.55, (0, 0, 0), 1)
        for j, name in enumerate(names):
            if name in picks and picks[name] in crops:
                img = crops[picks[name]][0]
                side = min(img.shape[:2])
                img = cv2.resize(img[:side, :side], (cell - 4, cell - 4), interpolation=cv2.INTER_CUBIC)
                sheet[y + 2 : y + cell - 2, label_w + j * cell + 2 : label_w + (j + 1) * cell - 2] = img
                cv2.putText(sheet, f"#{picks[name]}", (label_w + j * cell + 6, y + cell - 10),
                            cv2.FONT_HERSHEY_SIMPLEX, 0.45, (255, 255, 255), 1)  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    cv2.imwrite(str(tmp), cv2.cvtColor(sheet, cv2.COLOR_RGB2BGR))
    os.replace(tmp, path)


def run_side(checkout: Path, spec: dict, work: Path) -> dict:
    """One case on one side in a subprocess whose `lipstream` is the checkout's."""
    spec_path = work / "spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    load0 = os.getloadavg()[0]
    subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", str(spec_path)],
        cwd=checkout,
        env=env,
        check=True,
    )
    result = json.loads((Path(spec["out"]) / "result.json").read_text())
    result["load_before_run"] = round(load0, 2)
    return result


def main(argv: list[str] | None = None) -> int:
    """Prepare speech, avatars and the talking clip; render every case on both sides; measure; write."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--before", default="f70cc2d", help="commit of the 'before' engine")
    ap.add_argument(
        "--avatar", default="sample", help="prepared avatar in $LIPSTREAM_HOME (1080x1920 sample)"
    )
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=RESULTS / "realism_bench.json")
    ap.add_argument("--sheet", type=Path, default=REPO / "docs" / "img" / "mouth_contact_sheet.png")
    ap.add_argument("--keep", action="store_true", help="keep the work folder (videos)")
    ap.add_argument("--case", help="run only the cases whose name contains this (e.g. talking)")
    ap.add_argument(
        "--clip-from", type=Path, help="reuse the talking clip of a --keep run's work folder (same clip)"
    )
    ap.add_argument("--drawn-too", action="store_true", help="also this checkout with mouth=drawn")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if args.case is None or args.case in c.name]
    if not cases:
        ap.error(f"no case matches --case {args.case!r}; cases: {', '.join(c.name for c in CASES)}")
    if args.case and args.out == RESULTS / "realism_bench.json":
        args.out = RESULTS / f"realism_bench_{args.case.replace(' ', '_')}.json"
    if args.worker:
        worker(args.worker)
        return 0
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_common import cpu_model, open_or_build_avatar

    from lipstream.avatar.bundle import load_avatar
    from lipstream.avatar.prepare import prepare_avatar
    from lipstream.engines.viseme.engine import VisemeEngine
    from lipstream.render.compositor import Compositor
    from lipstream.render.offline import render_speech_to_mp4
    from lipstream.talk.voices.espeak_tts import EspeakTTS
    from lipstream.talk.voices.piper_tts import PiperTTS

    work = Path(tempfile.mkdtemp(prefix="realism-bench-"))
    from before_after import before_tree

    made_before = not (Path("/tmp") / f"lipstream-before-{args.before[:7]}").exists()
    before = before_tree(args.before)  # a worktree of that commit (removed at the end if made here)
    source = Path(open_or_build_avatar(args.avatar).path)
    t_start = time.time()
    load_start = os.getloadavg()
    # Speech: held-out text and voices (as lipsync_bench), cut to --seconds.
    voices = {c.voice for c in cases}
    if "piper" in voices:
        save_speech(PiperTTS(length_scale=1.1).synthesize(PIPER_TEXT), work / "piper.npz", args.seconds)
    if "espeak" in voices:
        save_speech(EspeakTTS(ESPEAK_VOICE).synthesize(PIPER_TEXT), work / "espeak.npz", args.seconds)
    t0 = time.perf_counter()
    talking = None
    if not any(c.avatar == "talking" for c in cases):
        pass  # no case needs the talking clip (e.g. --case espeak): not made
    elif args.clip_from:  # the talking clip, its speech and its prepared avatar from a --keep run
        shutil.copy(args.clip_from / "espeak-talking.npz", work / "espeak-talking.npz")
        clip = args.clip_from / "talking.mp4"
        talking = load_avatar(args.clip_from / "talking-src" / "talking")
    else:
        # The talking clip: this checkout's drawn mouth on the sample from espeak speech, prepared.
        talk_speech = EspeakTTS("en-us").synthesize(TALKING_TEXT)
        save_speech(talk_speech, work / "espeak-talking.npz")
        drawn_view = avatar_view(source, work / "drawn" / "avatars" / "sample")
        drawn = VisemeEngine(mouth="drawn")
        clip = work / "talking.mp4"
        render_speech_to_mp4(load_avatar(drawn_view), drawn, talk_speech, clip, persist_codebook=False)
        talking = prepare_avatar(clip, "talking", avatars_root=work / "talking-src", progress=False)
    talking_prepare_s = time.perf_counter() - t0
    bundles = {"sample": source}
    if talking is not None:
        # The compositor's I420 frames are prepare-time work: built once here, shared by both sides' views.
        first = int(talking.base_frame_indices(0, 1)[0])  # the idle loop need not start at frame 0
        Compositor(talking).compose_i420(first, np.zeros((talking.manifest.crop_size,) * 2 + (3,), np.uint8))
        bundles["talking"] = Path(talking.path)
    if any(c.avatar == "photo" for c in cases):  # one picture: prepare makes it breathe and blink
        import cv2

        from lipstream.avatar.sample import presenter_frame

        photo = work / "photo.png"
        cv2.imwrite(str(photo), cv2.cvtColor(presenter_frame(1080, 1920), cv2.COLOR_RGB2BGR))
        still = prepare_avatar(photo, "photo", avatars_root=work / "photo-src", progress=False)
        Compositor(still).compose_i420(
            int(still.base_frame_indices(0, 1)[0]), np.zeros((still.manifest.crop_size,) * 2 + (3,), np.uint8)
        )
        bundles["photo"] = Path(still.path)
    sides = {"before": before, "after": REPO}
    mouths = {}
    if args.drawn_too:
        sides["after-drawn"] = REPO
        mouths["after-drawn"] = "drawn"
    views = {
        (side, name): avatar_view(path, work / side / "avatars" / name)
        for side in sides
        for name, path in bundles.items()
    }
    results: dict = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "load_average_start": [round(v, 2) for v in load_start],
        "before_commit": args.before,
        "after_commit": subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip(),
        "seconds": args.seconds,
        "talking_clip": {"frames": talking.frame_count, "prepare_s": round(talking_prepare_s, 1)}
        if talking is not None
        else None,
        "cases": {},
    }
    sheet_rows = []
    clip_aperture = None
    for case in cases:
        z = np.load(work / f"{case.voice}.npz")
        per_side = {}
        for side, checkout in sides.items():
            out = work / side / case.name.replace(" ", "_").replace(",", "")
            out.mkdir(parents=True)
            spec = {
                "out": str(out),
                "speech": str(work / f"{case.voice}.npz"),
                "avatar": str(views[(side, case.avatar)]),
                "use_phonemes": case.use_phonemes,
                "fidelity": case.fidelity,
                "mouth": mouths.get(side),
            }
            per_side[side] = run_side(checkout, spec, work)
            shown = {k: v for k, v in per_side[side].items() if k != "stage_ms"}
            print(f"{case.name} / {side}: {json.dumps(shown)}", flush=True)
        bundle = load_avatar(views[("after", case.avatar)])
        frames = len(np.load(work / f"{case.voice}.npz")["pcm"]) // 640 + 1
        reference = rest_landmarks(views[("after", case.avatar)], frames, work / "after")
        feats_after = np.load(work / "after" / case.name.replace(" ", "_").replace(",", "") / "features.npz")
        opening = feats_after["features"][:, 0] * (1 - np.clip(feats_after["features"][:, 2], 0, 1))
        picks = pick_frames(frame_classes(z, len(opening)), opening)
        for side in sides:
            out = work / side / case.name.replace(" ", "_").replace(",", "")
            f = np.load(out / "features.npz")
            measured = measure_video(
                out / "out.mp4", f["features"], f["ids"], bundle, z, set(picks.values()), reference
            )
            crops = measured.pop("_crops")
            aperture = np.array(measured.pop("aperture"))
            if case.fidelity:
                if clip_aperture is None:
                    from lipstream.evaluation.lipsync import video_apertures

                    clip_aperture = video_apertures(clip, progress=False)
                m = min(len(aperture), len(clip_aperture))
                ok = np.isfinite(aperture[:m]) & np.isfinite(clip_aperture[:m])
                measured["opening_r_vs_clip"] = round(
                    float(np.corrcoef(aperture[:m][ok], clip_aperture[:m][ok])[0, 1]), 3
                )
            per_side[side].update(measured)
            if case.name != "sample espeak audio-only":
                source = per_side[side]["mouth_source"]
                kind = (
                    f"atlas, {source.split('(')[1].split(' ')[0]} mouths" if "atlas (" in source else "drawn"
                )
                label = f"{case.avatar}: {side}\n{kind}"
                sheet_rows.append((label, picks, crops))
            print(f"{case.name} / {side}: " + json.dumps({k: v for k, v in measured.items()}), flush=True)
        results["cases"][case.name] = {"picks": picks, **per_side}
    results["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    results["wall_s"] = round(time.time() - t_start, 1)
    if args.case and args.sheet == REPO / "docs" / "img" / "mouth_contact_sheet.png":
        args.sheet = work / "mouth_contact_sheet.png"  # a partial run leaves the docs' sheet alone
    contact_sheet(args.sheet, sheet_rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {args.out} and {args.sheet}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"kept {work}")
    if made_before:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(before)], check=False)
    chin_table(results)
    return 0


def chin_table(results: dict) -> None:
    """The jaw figures of every case, before and after side by side (both measures of the chin's drop)."""
    keys = ("chin_over_lip_drop", "chin_over_lip_retracked", "chin_on_lip_slope_retracked",
            "chin_over_lip_px", "gap_over_width_median", "pbm_closed_share")  # fmt: skip
    for name, case in results["cases"].items():
        sides = [s for s in ("before", "after", "after-drawn") if s in case]
        print(f"\n{name}: {'figure':30s} " + " ".join(f"{s:>12s}" for s in sides))
        for key in keys:
            print(f"  {key:30s} " + " ".join(f"{case[s].get(key)!s:>12s}" for s in sides))
        for key in ("correlation_best", "correlation_lag0"):  # the envelope r
            values = [case[s].get("lipsync", {}).get(key) for s in sides]
            print(f"  {'envelope ' + key:30s} " + " ".join(f"{v!s:>12s}" for v in values))


if __name__ == "__main__":
    raise SystemExit(main())

"""The realism benchmark's measurements on the rendered videos (this checkout's side): the mouth's classes
and chosen frames, the lip gap and width, the chin's amplitude, the contact sheet."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from benchmarks.scenarios.realism import CLASSES


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

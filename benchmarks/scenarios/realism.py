"""Weight-free mouth realism (issues 13, 22): the viseme engine of the lipstream this process was given.

The engine measured is the lipstream on PYTHONPATH when the script starts (before_after: either tree); it
renders in its own subprocess with PYTHONPATH pointing at that tree, on its own view of the avatar (a folder
of symlinks to the prepared frames with its own engine caches, so it never touches $LIPSTREAM_HOME). The
speech, the avatars and every figure are made here with this script's checkout, so two trees run side by
side are measured by the same code:

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks before_after --before REV -- realism [--seconds 20]

Every figure is measured on the decoded MP4s:

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

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks realism [--seconds 20]
  --case espeak    the held-out espeak speech on the sample and on the photo only (issue 37's check)

  --case talking   only the cases whose name contains "talking" (the atlas path; the others are skipped,
                   not changed); results then go to realism_bench_<case>.json, the sheet to the work folder
  --drawn-too      a second side, "drawn": the same engine with mouth=drawn, on the same clip

Writes benchmarks/results/realism_bench.json and docs/img/mouth_contact_sheet.png (with another --out, the
sheet goes beside it).
"""

from __future__ import annotations

import argparse
import importlib.util
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

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
SHEET = REPO / "docs" / "img" / "mouth_contact_sheet.png"
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

    sys.path.insert(0, str(REPO / "benchmarks"))  # the helpers, by bare name
    from siblings import scenario_module

    hot_path_ms = scenario_module("lipsync").hot_path_ms

    spec = json.loads(spec_path.read_text())
    out = Path(spec["out"])
    z = np.load(spec["speech"], allow_pickle=False)
    phonemes = [
        PhonemeTiming(str(p), int(s), int(e)) for p, s, e in zip(z["ph"], z["start"], z["end"], strict=True)
    ]
    speech = Speech(z["pcm"], phonemes=phonemes if spec["use_phonemes"] else None, text=str(z["text"]))
    bundle = load_avatar(spec["avatar"])
    # "mouth" only when asked (--drawn-too): an older tree's engine may not take it.
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
    ap.add_argument(
        "--avatar", default="sample", help="prepared avatar in $LIPSTREAM_HOME (1080x1920 sample)"
    )
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--out", type=Path, default=RESULTS / "realism_bench.json")
    ap.add_argument("--sheet", type=Path, default=SHEET)
    ap.add_argument("--keep", action="store_true", help="keep the work folder (videos)")
    ap.add_argument("--case", help="run only the cases whose name contains this (e.g. talking)")
    ap.add_argument(
        "--clip-from", type=Path, help="reuse the talking clip of a --keep run's work folder (same clip)"
    )
    ap.add_argument("--drawn-too", action="store_true", help="also the same engine with mouth=drawn")
    args = ap.parse_args(argv)
    if args.out != RESULTS / "realism_bench.json" and args.sheet == SHEET:
        args.sheet = args.out.with_suffix(".png")  # writing elsewhere (before_after): the docs' sheet stays
    cases = [c for c in CASES if args.case is None or args.case in c.name]
    if not cases:
        ap.error(f"no case matches --case {args.case!r}; cases: {', '.join(c.name for c in CASES)}")
    if args.case and args.out == RESULTS / "realism_bench.json":
        args.out = RESULTS / f"realism_bench_{args.case.replace(' ', '_')}.json"
    if args.worker:
        worker(args.worker)
        return 0
    # the engine measured: the lipstream PYTHONPATH names, found without importing it; everything else here is
    # made and measured with this script's checkout
    tree = Path(importlib.util.find_spec("lipstream").origin).resolve().parent.parent
    sys.path.insert(0, str(REPO))
    sys.path.insert(0, str(REPO / "benchmarks"))
    from bench_common import cpu_model, open_or_build_avatar

    from benchmarks.scenarios.realism_measure import (
        avatar_view,
        contact_sheet,
        frame_classes,
        measure_video,
        pick_frames,
        rest_landmarks,
        save_speech,
    )
    from lipstream.avatar.bundle import load_avatar
    from lipstream.avatar.prepare import prepare_avatar
    from lipstream.engines.viseme.engine import VisemeEngine
    from lipstream.render.compositor import Compositor
    from lipstream.render.offline import render_speech_to_mp4
    from lipstream.talk.voices.espeak_tts import EspeakTTS
    from lipstream.talk.voices.piper_tts import PiperTTS

    work = Path(tempfile.mkdtemp(prefix="realism-bench-"))
    source = Path(open_or_build_avatar(args.avatar).path)
    t_start = time.time()
    load_start = os.getloadavg()
    # Speech: held-out text and voices (as lipsync), cut to --seconds.
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
    sides = {"engine": tree}
    mouths = {}
    if args.drawn_too:
        sides["drawn"] = tree
        mouths["drawn"] = "drawn"
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
        "lipstream": str(tree),
        "commit": subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
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
        bundle = load_avatar(views[("engine", case.avatar)])
        frames = len(np.load(work / f"{case.voice}.npz")["pcm"]) // 640 + 1
        reference = rest_landmarks(views[("engine", case.avatar)], frames, work / "engine")
        feats = np.load(work / "engine" / case.name.replace(" ", "_").replace(",", "") / "features.npz")
        opening = feats["features"][:, 0] * (1 - np.clip(feats["features"][:, 2], 0, 1))
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
        # the engine's figures at the case's top; the drawn mouth's (--drawn-too) under "drawn"
        results["cases"][case.name] = {"picks": picks, **per_side.pop("engine"), **per_side}
    results["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    results["wall_s"] = round(time.time() - t_start, 1)
    if args.case and args.sheet == SHEET:
        args.sheet = work / "mouth_contact_sheet.png"  # a partial run leaves the docs' sheet alone
    contact_sheet(args.sheet, sheet_rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"wrote {args.out} and {args.sheet}")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"kept {work}")
    chin_table(results)
    return 0


def chin_table(results: dict) -> None:
    """The jaw figures of every case, the drawn mouth's beside them (--drawn-too); both chin measures."""
    keys = ("chin_over_lip_drop", "chin_over_lip_retracked", "chin_on_lip_slope_retracked",
            "chin_over_lip_px", "gap_over_width_median", "pbm_closed_share")  # fmt: skip
    for name, whole in results["cases"].items():
        case = {"engine": whole, **({"drawn": whole["drawn"]} if "drawn" in whole else {})}
        sides = list(case)
        print(f"\n{name}: {'figure':30s} " + " ".join(f"{s:>12s}" for s in sides))
        for key in keys:
            print(f"  {key:30s} " + " ".join(f"{case[s].get(key)!s:>12s}" for s in sides))
        for key in ("correlation_best", "correlation_lag0"):  # the envelope r
            values = [case[s].get("lipsync", {}).get(key) for s in sides]
            print(f"  {'envelope ' + key:30s} " + " ".join(f"{v!s:>12s}" for v in values))


if __name__ == "__main__":
    raise SystemExit(main())

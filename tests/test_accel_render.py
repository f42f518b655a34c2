"""Acceleration wired into rendering: fewer engine passes, same picture within the PSNR bound."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np
import pytest

from lipstream.audio.levels import SilenceDetector
from lipstream.avatar.bundle import load_avatar
from lipstream.engines.registry import create_engine
from lipstream.render.accel import AccelConfig, PatchScheduler, codebook_path, utterance_frames
from lipstream.render.compositor import Compositor
from lipstream.render.infill import crossfade
from lipstream.render.planner import INFILL, Plan, PlannerConfig


@pytest.fixture(scope="module")
def engine():
    return create_engine("viseme")


@pytest.fixture(scope="module")
def speech():
    from lipstream.talk.voices.tts import create_tts

    return create_tts("espeak").synthesize(
        "Tonight the bridge reopened. Thousands walked across it, and the mayor thanked the workers."
    )


@pytest.fixture()
def own_avatar(small_avatar, tmp_path: Path):
    """A private copy of the small avatar (these tests write codebooks into it)."""
    folder = shutil.copytree(small_avatar.path, tmp_path / "avatars" / small_avatar.name)
    for old in folder.glob("engines/*/codebook*.npz"):
        old.unlink()
    return load_avatar(folder)


def _schedule(bundle, engine, speech, config: AccelConfig, chunk: int | None = None):
    n = speech.frame_count
    frames = utterance_frames(bundle, engine, speech, config, SilenceDetector())
    feats, silent, base_ids = frames.features, frames.skip, frames.base_ids
    sched = PatchScheduler(bundle, engine, config)
    out = []
    step = chunk or n
    for a in range(0, n, step):
        span = slice(a, a + step)
        out += sched.push(feats[span], silent[span], base_ids[span], list(range(a, min(n, a + step))))
    out += sched.finish()
    return out, sched, base_ids


def _mouth_psnr(bundle, a_patches, b_patches, base_ids) -> np.ndarray:
    comp = Compositor(bundle)
    values = []
    for k, (pa, pb) in enumerate(zip(a_patches, b_patches, strict=True)):
        geo = comp.geometry(int(base_ids[k]))
        x0, y0, x1, y1 = geo.rect
        fa = comp.compose(int(base_ids[k]), pa)[y0:y1, x0:x1].astype(np.float64)
        fb = comp.compose(int(base_ids[k]), pb)[y0:y1, x0:x1].astype(np.float64)
        mse = np.mean((fa - fb) ** 2)
        values.append(99.0 if mse == 0 else 10 * np.log10(255.0**2 / mse))
    return np.array(values)


@pytest.mark.slow
def test_accelerated_patches_stay_within_psnr_of_full_render(own_avatar, engine, speech) -> None:
    engine.prepare(own_avatar)
    fast, sched, base_ids = _schedule(own_avatar, engine, speech, AccelConfig(enabled=True))
    full, _, _ = _schedule(own_avatar, engine, speech, AccelConfig(enabled=False))
    assert [k for k, _ in fast] == list(range(speech.frame_count)) == [k for k, _ in full]
    assert sched.stats.neural_frames < 0.5 * speech.frame_count
    assert sched.stats.keyframes + sched.stats.infill_frames + sched.stats.silent_frames == speech.frame_count
    psnr = _mouth_psnr(own_avatar, [p for _, p in fast], [p for _, p in full], base_ids)
    assert psnr.mean() >= 30.0, psnr


@pytest.mark.slow
def test_chunked_scheduling_equals_whole(own_avatar, engine, speech) -> None:
    # a fixed threshold: automatic calibration needs a chunk of >= 25 voiced frames
    config = AccelConfig(enabled=True, codebook=False, planner=PlannerConfig(velocity_threshold=0.02))
    whole, _, _ = _schedule(own_avatar, engine, speech, config)
    chunked, _, _ = _schedule(own_avatar, engine, speech, config, chunk=7)
    assert [k for k, _ in whole] == [k for k, _ in chunked]
    for (_, a), (_, b) in zip(whole, chunked, strict=True):
        assert (a is None and b is None) or np.array_equal(a, b)


@pytest.mark.slow
def test_infill_frames_are_crossfades_of_their_keyframes(own_avatar, engine, speech) -> None:
    config = AccelConfig(enabled=True, codebook=False)
    frames = utterance_frames(own_avatar, engine, speech, config, SilenceDetector())
    sched = PatchScheduler(own_avatar, engine, config)
    plan = Plan.concat([sched.planner.plan(frames.features, frames.skip), sched.planner.finish()])
    patches = dict(_schedule(own_avatar, engine, speech, AccelConfig(enabled=True, codebook=False))[0])
    infill = [i for i, kind in enumerate(plan.kind) if kind == INFILL]
    assert infill, "a sentence of speech must have infill frames"
    for i in infill[:10]:
        left, right, w = int(plan.left[i]), int(plan.right[i]), float(plan.weight[i])
        assert np.array_equal(patches[int(plan.index[i])], crossfade(patches[left], patches[right], w))


def _wav(path: Path, pcm: np.ndarray) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(np.clip(np.round(pcm * 32767), -32768, 32767).astype("<i2").tobytes())
    return path


@pytest.mark.slow
def test_seeded_codebook_is_persisted_and_reused(own_avatar, speech, tmp_path: Path) -> None:
    from lipstream.talk.voices.tts import create_tts

    wav = _wav(tmp_path / "seed.wav", speech.pcm)
    other = create_tts("espeak").synthesize("The bridge reopened tonight, and the workers walked across it.")
    test_wav = _wav(tmp_path / "test.wav", other.pcm)
    root = str(own_avatar.path.parent)
    cmd = [sys.executable, "-m", "lipstream"]
    res = subprocess.run(
        [*cmd, "avatar", "seed-codebook", own_avatar.name, "--avatars-dir", root, "--audio", str(wav)],
        capture_output=True, text=True, timeout=300,
    )
    assert res.returncode == 0, res.stderr
    book = codebook_path(own_avatar, create_engine("viseme"))
    assert book.is_file()
    manifest = json.loads((own_avatar.path / "manifest.json").read_text())
    assert manifest["engines"]["viseme"]["codebook"]["entries"] > 0
    reports = []
    for flag in (["--accel"], ["--no-accel"]):
        out, rep = tmp_path / f"out{len(reports)}.mp4", tmp_path / f"rep{len(reports)}.json"
        res = subprocess.run(
            [*cmd, "render", "--avatar", own_avatar.name, "--avatars-dir", root, "--audio", str(test_wav),
             "-o", str(out), "--report", str(rep), "--no-progress", *flag],
            capture_output=True, text=True, timeout=300,
        )
        assert res.returncode == 0, res.stderr
        reports.append(json.loads(rep.read_text()))
    accel, full = reports
    assert accel["codebook_hits"] > 0 and accel["accel"] and not full["accel"]
    assert full["neural_frames"] == full["frames"] and accel["neural_frames"] < full["neural_frames"] / 2
    for key in ("keyframes", "codebook_hits", "neural_frames", "ttff_ms"):
        assert key in accel


def test_acceleration_default_follows_the_engine(engine) -> None:
    from lipstream.render.accel import resolve_accel

    assert resolve_accel(None, engine).enabled is False  # the viseme engine costs less than accel saves
    assert resolve_accel(AccelConfig(enabled=True), engine).enabled is True
    assert resolve_accel(AccelConfig(enabled=False), engine).enabled is False

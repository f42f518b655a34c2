"""Loudness-driven opening, easing into rest around pauses, and the per-avatar opening calibration."""

from __future__ import annotations

import numpy as np
import pytest

from lipstream.audio.levels import SilenceDetector
from lipstream.audio.timeline import SAMPLE_RATE, SAMPLES_PER_FRAME
from lipstream.engines.base import PhonemeTiming, Speech
from lipstream.engines.viseme.articulation import CLOSURE, OPEN, WIDTH
from lipstream.engines.viseme.calibration import LEVELS, OpeningCurve
from lipstream.engines.viseme.engine import OPENING_FILE, VisemeEngine
from lipstream.engines.viseme.loudness import (
    ClosureGate,
    LoudnessConfig,
    ease_to_rest,
    loudness,
    scale_opening,
)


def test_loudness_is_relative_to_the_local_loudest_frame() -> None:
    cfg = LoudnessConfig()
    levels = np.array([-60.0, -45.0, -30.0, -15.0, -20.0, -45.0])
    loud = loudness(levels, cfg)
    assert loud[0] == 0.0 and loud[1] == 0.0 and loud[-1] == 0.0
    assert loud[3] == pytest.approx(1.0)
    assert loud[2] == pytest.approx(0.5)
    # 20 dB quieter everywhere: the reference follows, but the floor (silence) does not.
    quiet = loudness(levels - 10.0, cfg)
    assert np.all(quiet <= loud + 1e-6)
    # A loud frame more than back_frames earlier no longer sets the reference.
    far = np.full(cfg.back_frames + 10, -30.0)
    far[0] = -10.0
    assert loudness(far, cfg)[-1] == pytest.approx(1.0)


def test_louder_vowels_open_wider_and_closures_stay_shut() -> None:
    cfg = LoudnessConfig()
    feats = np.array([[0.85, 0.0, 0.0], [0.85, 0.0, 0.0], [0.0, 0.0, 1.0], [0.25, 0.6, 0.0]], np.float32)
    out = scale_opening(feats, np.array([1.0, 0.4, 1.0, 1.0], np.float32), cfg)
    assert out[0, OPEN] > out[1, OPEN] > 0.0
    assert out[0, OPEN] == pytest.approx(cfg.open_gain**cfg.open_power)
    assert out[2, OPEN] == 0.0 and out[2, CLOSURE] == 1.0
    assert out[3, WIDTH] == feats[3, WIDTH]
    assert out[0, OPEN] > out[3, OPEN]  # vowel height still counts at equal loudness


def test_ease_tapers_frames_next_to_silence() -> None:
    cfg = LoudnessConfig(ease_frames=2)
    feats = np.tile(np.array([[0.6, 0.5, 0.0, 0.0]], np.float32), (8, 1))
    silent = np.zeros(8 + 4, bool)
    silent[2 + 6 :] = True  # rows 6, 7 and beyond are silent
    out = ease_to_rest(feats, silent, cfg)
    # silence closes the lips (a closed-mouth smile for a presenter whose rest shows the teeth)
    assert cfg.pause_closure == 1.0 and np.all(out[6:, CLOSURE] == 1.0)
    assert np.all(out[6:, [OPEN, WIDTH, 3]] == 0.0)
    assert np.all(out[:6, CLOSURE] == 0.0)
    rest = ease_to_rest(feats, silent, LoudnessConfig(ease_frames=2, pause_closure=0.0))
    assert np.all(rest[6:] == 0.0)  # pause_closure 0: silence shows the footage's own mouth
    assert out[5, OPEN] == pytest.approx(0.6 / 3)
    assert out[4, OPEN] == pytest.approx(0.6 * 2 / 3)
    assert out[3, OPEN] == pytest.approx(0.6)
    with pytest.raises(ValueError):
        ease_to_rest(feats, silent[:-1], cfg)


def test_opening_curve_inverts_a_measured_response() -> None:
    levels = np.asarray(LEVELS, np.float32)
    measured = 0.1 + 0.3 * np.sqrt(levels)  # a concave response, like the tracker's on a parted mouth
    curve = OpeningCurve(levels, measured.astype(np.float32))
    command = np.linspace(0.0, 1.0, 21, dtype=np.float32)
    warp = curve.warp_opening(command)
    seen = np.interp(warp, levels, measured)
    np.testing.assert_allclose(seen, 0.1 + 0.3 * command, atol=0.01)
    assert warp[0] == 0.0
    np.testing.assert_allclose(OpeningCurve.identity().warp_opening(command), command, atol=1e-5)
    np.testing.assert_allclose(OpeningCurve.unpack(curve.pack()).aperture, curve.aperture)


@pytest.mark.slow
def test_prepare_measures_a_rising_opening_curve(small_avatar) -> None:
    engine = VisemeEngine()
    engine.prepare(small_avatar)
    curve = OpeningCurve.unpack(np.load(small_avatar.engine_dir("viseme") / OPENING_FILE))
    assert curve.aperture[-1] > curve.aperture[0] + 0.1  # the tracker sees the warp open the mouth
    assert np.corrcoef(curve.levels, curve.aperture)[0, 1] > 0.9


def test_a_louder_syllable_renders_a_wider_mouth() -> None:
    """Same phonemes twice, the second 12 dB quieter: the features open less on the quiet one."""
    rng = np.random.default_rng(0)
    frames = 10
    tone = (np.sin(2 * np.pi * 180 * np.arange(frames * SAMPLES_PER_FRAME) / SAMPLE_RATE)).astype(np.float32)
    tone += 0.05 * rng.standard_normal(tone.size).astype(np.float32)
    gap = np.zeros(6 * SAMPLES_PER_FRAME, np.float32)
    pcm = np.concatenate([gap, 0.2 * tone, gap, 0.05 * tone, gap])
    span = frames * SAMPLES_PER_FRAME
    a0, a1 = gap.size, gap.size + span
    b0 = a1 + gap.size
    phonemes = [PhonemeTiming("ɑ", a0, a1), PhonemeTiming("_", a1, b0), PhonemeTiming("ɑ", b0, b0 + span)]
    feats = VisemeEngine().features(Speech(pcm, phonemes=phonemes))
    mid_a = (a0 + a1) // 2 // SAMPLES_PER_FRAME
    mid_b = (b0 + b0 + span) // 2 // SAMPLES_PER_FRAME
    assert feats[mid_a, OPEN] > 1.3 * feats[mid_b, OPEN] > 0.0


def test_closure_gate_needs_confidence_and_a_quiet_frame() -> None:
    gate = ClosureGate(min_confidence=0.45, max_loudness=0.75, sure=0.7, max_loudness_sure=0.85, full_at=0.6)
    closures = [0.9, 0.9, 0.3, 0.48, 0.9, 0.6]
    feats = np.array([[0.1, 0.0, c] for c in closures], np.float32)
    out = gate.apply(feats, np.array([0.5, 0.95, 0.2, 0.5, 0.8, 0.8], np.float32))
    # kept: shut fully from full_at, scaled below it; a sure closure survives a louder frame (/m/), a
    # doubtful one does not
    np.testing.assert_allclose(out[:, CLOSURE], [1.0, 0.0, 0.0, 0.8, 1.0, 0.0], atol=1e-6)
    np.testing.assert_array_equal(out[:, :CLOSURE], feats[:, :CLOSURE])


@pytest.mark.slow
def test_audio_only_on_piper_has_no_flood_of_false_closures() -> None:
    """Piper at a rate the model never trained on: audio-only closures stay about as rare as the real ones."""
    from lipstream.engines.viseme.articulation import frames_from_phonemes
    from lipstream.talk.voices.piper_tts import PiperTTS

    speech = PiperTTS(length_scale=1.1).synthesize(
        "Maybe the bus will be late this morning, but the market opens at ten."
    )
    audio_only = VisemeEngine(use_phonemes=False).features(Speech(speech.pcm))
    with_timings = VisemeEngine().features(speech)
    truth = frames_from_phonemes(speech.phonemes, speech.frame_count)[:, CLOSURE] > 0.5
    silent = SilenceDetector().silent_mask(speech.pcm)[: len(audio_only)]
    predicted = (audio_only[:, CLOSURE] > 0.0) & ~silent  # pauses close the lips too: not a p/b/m
    assert predicted.sum() <= 2 * truth.sum() + 2
    assert np.corrcoef(audio_only[:, OPEN], with_timings[:, OPEN])[0, 1] > 0.7


@pytest.mark.slow
def test_another_warp_recalibrates_and_drops_stale_codebooks(small_avatar) -> None:
    from lipstream.engines.viseme.warp import WarpConfig

    first = VisemeEngine()
    first.prepare(small_avatar)
    folder = small_avatar.engine_dir("viseme")
    stale = folder / f"codebook-{first.cache_key}.npz"
    stale.write_bytes(b"patches drawn by the old warp")
    wider = VisemeEngine(warp=WarpConfig(jaw_drop=0.8))
    assert wider.cache_key != first.cache_key
    wider.prepare(small_avatar)
    assert small_avatar.manifest.engines["viseme"]["warp"] == wider.cache_key
    assert not stale.exists()
    curve = OpeningCurve.unpack(np.load(folder / OPENING_FILE))
    assert curve.aperture[-1] > curve.aperture[0]


def test_opening_curve_is_capped_at_the_speech_range() -> None:
    """Issue 22: command 1 lands on the speech range's widest aperture, not on the warp's widest gape."""
    levels = np.asarray(LEVELS, np.float32)
    measured = (0.15 + 0.35 * levels).astype(np.float32)  # this warp could gape to half the mouth's width
    curve = OpeningCurve(levels, measured).capped(0.4)
    assert curve.aperture[-1] == pytest.approx(0.4)
    assert curve.levels[-1] == pytest.approx(0.25 / 0.35, abs=1e-5)
    warp = curve.warp_opening(np.array([0.0, 0.5, 1.0], np.float32))
    np.testing.assert_allclose(np.interp(warp, levels, measured), [0.15, 0.275, 0.4], atol=1e-5)
    narrow = OpeningCurve(levels, (0.15 + 0.1 * levels).astype(np.float32))
    assert narrow.capped(0.4) is narrow  # a warp that never gets there keeps its whole range


def test_gap_over_width_is_the_inner_gap_over_the_corner_distance() -> None:
    from lipstream.avatar.face_measures import gap_over_width

    landmarks = np.zeros((478, 2), np.float32)
    landmarks[61], landmarks[291] = (100, 200), (160, 200)  # mouth corners, 60 px apart
    landmarks[13], landmarks[14] = (130, 195), (130, 207)  # inner lips, 12 px apart
    assert gap_over_width(landmarks) == pytest.approx(0.2)

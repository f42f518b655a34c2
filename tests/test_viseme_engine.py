"""The viseme engine: articulation from timings and audio, silence, streaming, and the mouth warp."""

from __future__ import annotations

import numpy as np
import pytest

from lipstream.audio.timeline import SAMPLE_RATE, SAMPLES_PER_FRAME
from lipstream.engines.base import Engine, PhonemeTiming, Speech
from lipstream.engines.registry import create_engine
from lipstream.engines.viseme.articulation import CLOSURE, OPEN, WIDTH, frames_from_phonemes
from lipstream.engines.viseme.engine import VisemeEngine, source_crop
from lipstream.errors import ModelError


@pytest.fixture(scope="module")
def engine() -> VisemeEngine:
    """One engine for the module (loads the shipped weights)."""
    return create_engine("viseme")


@pytest.fixture(scope="module")
def espeak_speech() -> Speech:
    """A sentence the model was not trained on, from espeak-ng with its phoneme timings."""
    from lipstream.talk.tts import create_tts

    return create_tts("espeak").synthesize("Maybe the weather will be warmer on Thursday, said Bob.")


def _timing(seq: list[tuple[str, float, float]]) -> list[PhonemeTiming]:
    return [PhonemeTiming(p, int(a * SAMPLE_RATE), int(b * SAMPLE_RATE)) for p, a, b in seq]


def test_registry_builds_an_engine_with_options() -> None:
    eng = create_engine("viseme", use_phonemes=False, silence_dbfs=-50.0)
    assert isinstance(eng, Engine)
    assert eng.feature_kind == "viseme" and eng.patch_size == 256 and eng.feature_dim == 3
    assert eng.lookahead_frames * SAMPLES_PER_FRAME <= 0.2 * SAMPLE_RATE


def test_missing_weights_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ModelError, match="not found"):
        VisemeEngine(model_path=tmp_path / "nope.npz")
    bad = tmp_path / "bad.npz"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ModelError, match="unreadable"):
        VisemeEngine(model_path=bad)


def test_timings_give_closure_on_bilabials_and_rest_in_pauses() -> None:
    # "_ m a p a _": pause, m, a, p, a, pause (seconds)
    timing = _timing(
        [
            ("_", 0, 0.4),
            ("m", 0.4, 0.52),
            ("ɑː", 0.52, 0.8),
            ("p", 0.8, 0.9),
            ("uː", 0.9, 1.2),
            ("_", 1.2, 1.6),
        ]
    )
    f = frames_from_phonemes(timing, 40)
    assert np.all(f[:6] < 0.05)  # long pause: rest
    assert f[11, CLOSURE] == 1.0 and f[11, OPEN] == 0.0  # centre of "m" (0.44-0.48 s)
    assert f[16, OPEN] > 0.6  # "ɑː" is wide open
    assert f[21, CLOSURE] == 1.0  # "p"
    assert f[26, WIDTH] < -0.5  # "uː" is rounded
    assert np.all(np.abs(f[36:]) < 0.05)


def test_silence_gives_exactly_zero_features(engine: VisemeEngine) -> None:
    zeros = Speech(np.zeros(SAMPLE_RATE * 2, dtype=np.float32))
    assert engine.features(zeros).shape == (50, 3)
    assert not engine.features(zeros).any()
    hiss = np.random.default_rng(0).normal(0, 10 ** (-70 / 20), SAMPLE_RATE * 2).astype(np.float32)
    assert not engine.features(Speech(hiss)).any()
    # Known timings cannot open the mouth over silent audio either.
    timing = _timing([("ɑː", 0.0, 2.0)])
    assert not engine.features(Speech(np.zeros(SAMPLE_RATE * 2, dtype=np.float32), phonemes=timing)).any()


def test_audio_only_features_follow_the_phonemes(engine: VisemeEngine, espeak_speech: Speech) -> None:
    audio_only = VisemeEngine(use_phonemes=False).features(espeak_speech)
    labels = frames_from_phonemes(espeak_speech.phonemes, espeak_speech.frame_count)
    with_timings = engine.features(espeak_speech)
    assert audio_only.shape == labels.shape == with_timings.shape == (espeak_speech.frame_count, 3)
    # Both paths scale the opening by the same loudness, so they agree on it more than on the table shape.
    assert np.corrcoef(audio_only[:, OPEN], with_timings[:, OPEN])[0, 1] > 0.8
    assert np.corrcoef(audio_only[:, WIDTH], labels[:, WIDTH])[0, 1] > 0.5
    assert np.corrcoef(with_timings[:, WIDTH], labels[:, WIDTH])[0, 1] > 0.9
    assert np.corrcoef(with_timings[:, OPEN], labels[:, OPEN])[0, 1] > 0.7


def test_stream_matches_whole_utterance_within_lookahead(espeak_speech: Speech) -> None:
    eng = VisemeEngine(use_phonemes=False)
    whole = eng.features(espeak_speech)
    stream = eng.stream_features()
    rng = np.random.default_rng(1)
    pcm, pos, got = espeak_speech.pcm, 0, []
    while pos < pcm.size:
        step = int(rng.integers(100, 1500))
        rows = stream.push(pcm[pos : pos + step])
        pos += step
        got.append(rows)
        emitted = sum(len(r) for r in got)
        # Rows are final no later than lookahead_frames after their audio arrived.
        assert emitted >= min(pos, pcm.size) // SAMPLES_PER_FRAME - eng.lookahead_frames
    got.append(stream.finish())
    streamed = np.concatenate(got)
    assert streamed.shape == whole.shape
    np.testing.assert_allclose(streamed, whole, atol=1e-5)


def test_prepare_caches_crops_and_is_idempotent(engine: VisemeEngine, small_avatar) -> None:
    engine.prepare(small_avatar)
    entry = small_avatar.manifest.engines["viseme"]
    folder = small_avatar.engine_dir("viseme")
    crops = np.load(folder / entry["crops"], mmap_mode="r")
    assert crops.shape == (small_avatar.frame_count, 256, 256, 3)
    np.testing.assert_array_equal(crops[3], source_crop(small_avatar, 3))
    mtime = (folder / entry["crops"]).stat().st_mtime_ns
    engine.prepare(small_avatar)
    assert (folder / entry["crops"]).stat().st_mtime_ns == mtime


def test_zero_features_render_the_source_crop_exactly(engine: VisemeEngine, small_avatar) -> None:
    ids = np.array([0, 7, 21])
    patches = engine.render(small_avatar, np.zeros((3, 3), np.float32), ids)
    assert patches.shape == (3, 256, 256, 3) and patches.dtype == np.uint8
    for patch, fid in zip(patches, ids, strict=True):
        np.testing.assert_array_equal(patch, source_crop(small_avatar, int(fid)))


def test_speech_moves_only_the_mouth_below_the_nose(engine: VisemeEngine, small_avatar) -> None:
    feats = np.array([[0.9, 0.0, 0.0], [0.4, 0.6, 0.0], [0.3, -0.85, 0.0], [0.0, 0.0, 1.0]], np.float32)
    ids = np.array([5, 5, 12, 30])
    patches = engine.render(small_avatar, feats, ids)
    for patch, fid in zip(patches, ids, strict=True):
        src = source_crop(small_avatar, int(fid))
        nose = int(np.floor(small_avatar.nose_base[fid]))
        np.testing.assert_array_equal(patch[: nose + 1], src[: nose + 1])
    # Opening changes the mouth and darkens it (cavity); the change lies inside the mouth mask.
    src = source_crop(small_avatar, 5).astype(int)
    diff = np.abs(patches[0].astype(int) - src).sum(axis=2)
    assert diff.max() > 60
    mask = np.asarray(small_avatar.masks[5])
    assert diff[mask == 0].sum() < 0.05 * diff.sum()
    assert patches[0].mean() < src.mean()
    again = engine.render(small_avatar, feats, ids)
    np.testing.assert_array_equal(again, patches)  # deterministic
    # More opening parts the lips further: more dark pixels in the mouth region.
    wide = engine.render(small_avatar, np.array([[0.3, 0, 0], [0.9, 0, 0]], np.float32), np.array([5, 5]))
    dark = [(p.max(axis=2) < 70)[mask > 0].sum() for p in wide]
    assert dark[1] > dark[0]


def test_render_rejects_mismatched_batches(engine: VisemeEngine, small_avatar) -> None:
    with pytest.raises(ValueError):
        engine.render(small_avatar, np.zeros((2, 3), np.float32), np.array([0]))

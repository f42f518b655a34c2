"""MuseTalk audio features: window formula, frame alignment, segments and streaming, on a tiny Whisper."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
import torch

from lipstream.audio.timeline import SAMPLE_RATE, frame_count
from lipstream.engines.musetalk.features import (
    SEGMENT_SAMPLES,
    WhisperFeaturizer,
    encoder_steps,
    frame_windows,
    window_steps,
)
from lipstream.engines.musetalk.layout import ModelPaths
from lipstream.engines.musetalk.loader import load_whisper, resolve_runtime
from lipstream.engines.musetalk.topology import write_model_folder


@pytest.fixture(scope="module")
def featurizer(tmp_path_factory: pytest.TempPathFactory) -> WhisperFeaturizer:
    """A tiny same-topology Whisper (4 layers -> 5 states, d_model 64) loaded by the real loader."""
    root = write_model_folder(tmp_path_factory.mktemp("models"), versions=("1.5",))
    encoder, extractor = load_whisper(ModelPaths.resolve(root, "1.5"), resolve_runtime("cpu", "fp32"))
    return WhisperFeaturizer(encoder, extractor)


@pytest.fixture(scope="module")
def speech_pcm(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """About 1.5 s of espeak-ng speech at 16 kHz."""
    from lipstream.audio.decode import load_audio

    if not shutil.which("espeak-ng"):
        pytest.skip("espeak-ng is not installed")
    wav = tmp_path_factory.mktemp("speech") / "hello.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), "Hello, how are you?"], check=True)
    return load_audio(wav)


def reference_states(featurizer: WhisperFeaturizer, pcm: np.ndarray) -> np.ndarray:
    """Stacked hidden states of one <=30 s segment, straight from transformers (no lipstream code)."""
    mel = featurizer.extractor(pcm, sampling_rate=SAMPLE_RATE, return_tensors="pt").input_features
    with torch.inference_mode():
        hidden = featurizer.encoder(mel, output_hidden_states=True).hidden_states
    assert len(hidden) == 5  # embedding + 4 layers; the last one after the final LayerNorm
    return torch.stack(hidden, dim=2)[0].numpy()


def test_window_formula_first_frames() -> None:
    assert window_steps(0).tolist() == list(range(-4, 6))
    assert window_steps(1).tolist() == list(range(-2, 8))
    assert window_steps(7).tolist() == list(range(10, 20))


def test_frame_windows_padding_and_time_major_layout() -> None:
    steps, n_states, dim = 9, 5, 3
    # each value encodes (step, state, channel) so the layout can be read back
    states = np.fromfunction(
        lambda t, s, d: 100 * (t + 1) + 10 * s + d, (steps, n_states, dim), dtype=np.float32
    )
    out = frame_windows(states, 0, 4, total_steps=steps)
    assert out.shape == (4, 10 * n_states * dim)
    first = out[0].reshape(10, n_states, dim)
    assert np.all(first[:4] == 0)  # steps -4..-1 are zero padding
    np.testing.assert_array_equal(first[4:], states[0:6])
    # time-major flattening: token index = step * 5 + state
    tokens = out[0].reshape(10 * n_states, dim)
    np.testing.assert_array_equal(tokens[4 * n_states + 2], states[0, 2])
    last = out[3].reshape(10, n_states, dim)  # frame 3 reads steps 2..11; 9..11 lie past the end
    np.testing.assert_array_equal(last[:7], states[2:9])
    assert np.all(last[7:] == 0)


def test_features_match_formula_on_speech(featurizer: WhisperFeaturizer, speech_pcm: np.ndarray) -> None:
    feats = featurizer.features(speech_pcm)
    n = frame_count(len(speech_pcm))
    assert feats.shape == (n, 10 * 5 * 64) and feats.dtype == np.float32
    states = reference_states(featurizer, speech_pcm)[: encoder_steps(len(speech_pcm))]
    for f in (0, 1, n // 2, n - 1):
        window = feats[f].reshape(10, 5, 64)
        for j, step in enumerate(range(2 * f - 4, 2 * f + 6)):
            expected = states[step] if 0 <= step < len(states) else np.zeros((5, 64), np.float32)
            np.testing.assert_allclose(window[j], expected, atol=1e-5, err_msg=f"frame {f} step {step}")


def test_clip_shorter_than_one_window(featurizer: WhisperFeaturizer) -> None:
    assert featurizer.features(np.zeros(500, np.float32)).shape == (0, 3200)  # < 40 ms: no frame
    pcm = np.random.default_rng(0).normal(0, 0.1, 1000).astype(np.float32)  # 62.5 ms: 1 frame, 3 steps
    feats = featurizer.features(pcm)
    assert feats.shape == (1, 3200)
    window = feats[0].reshape(10, 5, 64)
    states = reference_states(featurizer, pcm)
    assert np.all(window[:4] == 0) and np.all(window[7:] == 0)
    np.testing.assert_allclose(window[4:7], states[:3], atol=1e-5)


@pytest.mark.slow
def test_long_audio_is_cut_into_30s_segments(featurizer: WhisperFeaturizer) -> None:
    pcm = np.random.default_rng(1).normal(0, 0.05, SEGMENT_SAMPLES + 16_000).astype(np.float32)  # 31 s
    states = featurizer.states(pcm)
    assert states.shape == (encoder_steps(len(pcm)), 5, 64) == (1550, 5, 64)
    np.testing.assert_allclose(states[:1500], reference_states(featurizer, pcm[:SEGMENT_SAMPLES]), atol=1e-5)
    np.testing.assert_allclose(
        states[1500:], reference_states(featurizer, pcm[SEGMENT_SAMPLES:])[:50], atol=1e-5
    )
    feats = featurizer.features(pcm)
    seam = feats[750].reshape(10, 5, 64)  # frame 750 reads steps 1496..1505: both segments
    np.testing.assert_allclose(seam, states[1496:1506], atol=1e-6)

    # streaming over the same audio: a completed segment is encoded once; one push reproduces the file
    stream = featurizer.stream()
    streamed = np.concatenate([stream.push(pcm), stream.finish()])
    np.testing.assert_allclose(streamed, feats, atol=1e-5)


def test_stream_emits_frames_with_two_frames_of_lookahead(
    featurizer: WhisperFeaturizer, speech_pcm: np.ndarray
) -> None:
    stream = featurizer.stream()
    chunk = 4000  # 250 ms pushes
    got, pushes = [], 0
    for start in range(0, len(speech_pcm), chunk):
        out = stream.push(speech_pcm[start : start + chunk])
        pushes += 1
        got.append(out)
        emitted = sum(len(g) for g in got)
        assert emitted == max(0, frame_count(min(len(speech_pcm), start + chunk)) - 2)
    got.append(stream.finish())
    feats = np.concatenate(got)
    offline = featurizer.features(speech_pcm)
    assert feats.shape == offline.shape
    assert stream.encodes <= pushes + 1  # at most one (partial-segment) encode per push, plus finish
    # the first windows (steps < 0 padded) agree on the zero padding; the tail frames, computed at finish
    # with all the audio, match the offline features exactly
    np.testing.assert_array_equal(feats[0].reshape(10, 5, 64)[:4], 0)
    np.testing.assert_allclose(feats[-2:], offline[-2:], atol=1e-5)

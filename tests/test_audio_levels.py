"""Per-frame levels and silence decisions."""

from __future__ import annotations

import numpy as np

from lipstream.audio.levels import DEFAULT_SILENCE_DBFS, SILENCE_FLOOR_DBFS, SilenceDetector, frame_rms


def test_frame_rms_values_and_count() -> None:
    t = np.arange(640 * 5 + 100) / 16000
    sine = np.sin(2 * np.pi * 500 * t).astype(np.float32)  # full-scale: -3.01 dBFS
    levels = frame_rms(sine)
    assert levels.shape == (5,)
    assert np.allclose(levels, -3.01, atol=0.02)
    assert frame_rms(np.zeros(640 * 2, np.float32)).tolist() == [SILENCE_FLOOR_DBFS] * 2
    assert frame_rms(np.zeros(639, np.float32)).shape == (0,)


def test_silence_mask_follows_threshold_and_min_run() -> None:
    rng = np.random.default_rng(1)
    loud = 0.1 * rng.standard_normal(640 * 10).astype(np.float32)  # about -20 dBFS
    hush = 0.0005 * rng.standard_normal(640).astype(np.float32)  # about -66 dBFS
    pcm = np.concatenate([np.tile(hush, 6), loud, np.tile(hush, 2), loud, np.tile(hush, 4), np.zeros(300)])
    mask = SilenceDetector().silent_mask(pcm)
    assert mask.shape == (6 + 10 + 2 + 10 + 4,)
    assert mask[:6].all() and mask[-4:].all()
    assert not mask[6:16].any()
    assert not mask[16:18].any()  # a 2-frame gap is a stop closure, not a pause
    assert SilenceDetector(min_silent_frames=1).silent_mask(pcm)[16:18].all()


def test_is_silent_and_threshold_default() -> None:
    detector = SilenceDetector()
    assert detector.threshold_dbfs == DEFAULT_SILENCE_DBFS
    assert detector.is_silent(np.zeros(16000, np.float32))
    assert detector.is_silent(np.zeros(10, np.float32))
    assert not detector.is_silent(np.full(16000, 0.05, np.float32))

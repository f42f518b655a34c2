"""Keyframe planner on synthetic feature streams: steady vowels, plosive-like bursts, pauses."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from lipstream.render.planner import (
    INFILL,
    KEYFRAME,
    SILENT,
    KeyframePlanner,
    Plan,
    PlannerConfig,
    acoustic_velocity,
)

DIM = 12


def _stream(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """10 silent, 40 steady (slow drift), 20 bursty (large jumps), 8 silent, 12 steady frames."""
    rng = np.random.default_rng(seed)
    parts, silent = [], []

    def steady(n: int) -> None:
        start = rng.standard_normal(DIM)
        parts.append(start + np.cumsum(0.02 * rng.standard_normal((n, DIM)), axis=0))
        silent.extend([False] * n)

    def pause(n: int) -> None:
        parts.append(np.zeros((n, DIM)))
        silent.extend([True] * n)

    pause(10)
    steady(40)
    parts.append(rng.standard_normal((20, DIM)) * 2.0)  # plosive-like bursts: every frame differs a lot
    silent.extend([False] * 20)
    pause(8)
    steady(12)
    return np.concatenate(parts).astype(np.float32), np.array(silent)


def _check_plan(plan: Plan, silent: np.ndarray, slow_stride: int) -> None:
    assert plan.index.tolist() == list(range(len(silent)))
    assert np.array_equal(plan.kind == SILENT, silent)
    keys = np.flatnonzero(plan.kind == KEYFRAME)
    for run_start, run_end in _voiced_runs(silent):
        run_keys = keys[(keys >= run_start) & (keys < run_end)]
        assert (
            run_keys[0] == run_start and run_keys[-1] == run_end - 1
        )  # each voiced run opens and closes on a key
        assert np.diff(run_keys).max(initial=0) <= slow_stride
    for i in np.flatnonzero(plan.kind == INFILL):
        left, right = plan.left[i], plan.right[i]
        assert plan.kind[left] == KEYFRAME and plan.kind[right] == KEYFRAME and left < i < right
        assert np.isclose(plan.weight[i], (i - left) / (right - left))


def _voiced_runs(silent: np.ndarray) -> list[tuple[int, int]]:
    edges = np.diff(np.concatenate([[1], silent.astype(int), [1]]))
    return list(zip(np.flatnonzero(edges == -1), np.flatnonzero(edges == 1), strict=True))


def test_velocity_definition() -> None:
    feats = np.array([[0, 0], [1, 3], [1, 3]], np.float32)
    assert acoustic_velocity(feats).tolist() == [np.inf, 2.0, 0.0]
    assert acoustic_velocity(feats[:1], previous=np.array([2, 2])).tolist() == [2.0]


def test_schedule_dense_on_bursts_sparse_on_steady() -> None:
    feats, silent = _stream()
    planner = KeyframePlanner(PlannerConfig(fast_stride=2, slow_stride=4))
    threshold = planner.calibrate(feats, silent)
    assert threshold > 0
    plan = Plan.concat([planner.plan(feats, silent), planner.finish()])
    _check_plan(plan, silent, 4)
    keys = plan.kind == KEYFRAME
    steady_rate = keys[11:50].mean()  # after the onset
    burst_rate = keys[51:70].mean()
    assert 0.2 <= steady_rate <= 0.3  # every 4th frame
    assert 0.45 <= burst_rate <= 0.55  # every 2nd frame
    voiced = (~silent).sum()
    assert keys.sum() < 0.45 * voiced


def test_streaming_chunks_match_whole_stream() -> None:
    feats, silent = _stream(seed=2)
    config = PlannerConfig(velocity_threshold=0.5)
    whole = KeyframePlanner(config)
    expected = Plan.concat([whole.plan(feats, silent), whole.finish()])
    streamed = KeyframePlanner(config)
    parts, pos = [], 0
    for size in [1, 3, 7, 2, 11, 5, 40, 13, 100]:
        part = streamed.plan(feats[pos : pos + size], silent[pos : pos + size])
        assert np.all(np.diff(part.index) == 1)
        if parts and len(part) and len(parts[-1]):
            assert part.index[0] > parts[-1].index[-1]  # decisions arrive in time order
        parts.append(part)
        pos += size
    parts.append(streamed.finish())
    got = Plan.concat(parts)
    for field in ("index", "kind", "left", "right", "weight"):
        assert np.array_equal(getattr(got, field), getattr(expected, field)), field


def test_held_back_frames_are_bounded() -> None:
    feats, silent = _stream(seed=3)
    planner = KeyframePlanner(PlannerConfig(velocity_threshold=0.5, slow_stride=5))
    released = 0
    for i in range(len(feats)):
        released += len(planner.plan(feats[i : i + 1], silent[i : i + 1]))
        assert (i + 1) - released <= 5 - 1
    released += len(planner.finish())
    assert released == len(feats)


def test_all_silent_and_config_validation() -> None:
    planner = KeyframePlanner()
    plan = planner.plan(np.zeros((6, DIM)), np.ones(6, bool))
    assert (plan.kind == SILENT).all() and len(planner.finish()) == 0
    with pytest.raises(ValidationError):
        PlannerConfig(fast_stride=5, slow_stride=3)
    with pytest.raises(ValueError, match="silent mask"):
        KeyframePlanner().plan(np.zeros((4, DIM)), np.zeros(3, bool))


def test_auto_calibration_waits_for_enough_voiced_frames() -> None:
    feats, silent = _stream(seed=4)
    planner = KeyframePlanner()
    planner.plan(feats[:12], silent[:12])  # 10 silent + 2 voiced: too few to calibrate on
    assert planner.config.velocity_threshold is None
    planner.plan(feats[12:], silent[12:])
    assert planner.config.velocity_threshold is not None and planner.config.velocity_threshold > 0

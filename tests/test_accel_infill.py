"""Cross-fade infill: exact endpoints, linear in between, in place."""

from __future__ import annotations

import numpy as np
import pytest
from skimage.data import astronaut

from lipstream.render.infill import CrossFader, crossfade, fill_between


def _patches() -> tuple[np.ndarray, np.ndarray]:
    face = np.ascontiguousarray(astronaut()[100:164, 180:244])
    return face, np.ascontiguousarray(face[::-1, ::-1])


def test_endpoints_are_the_keyframes() -> None:
    a, b = _patches()
    assert np.array_equal(crossfade(a, b, 0.0), a)
    assert np.array_equal(crossfade(a, b, 1.0), b)
    extremes = (np.zeros_like(a), np.full_like(a, 255))
    assert np.array_equal(crossfade(*extremes, 1.0), extremes[1])


def test_midpoint_is_linear() -> None:
    a, b = _patches()
    expected = a.astype(np.float64) * 0.75 + b.astype(np.float64) * 0.25
    got = crossfade(a, b, 0.25)
    assert np.abs(got - expected).max() <= 1.0


def test_writes_in_place() -> None:
    a, b = _patches()
    fader = CrossFader(a.shape)
    out = np.empty_like(a)
    result = crossfade(a, b, 0.5, out=out, fader=fader)
    assert result is out
    with pytest.raises(ValueError, match="uint8"):
        fader.blend(a.astype(np.float32), b, 0.5, out)


def test_fill_between_runs_from_a_to_b() -> None:
    a, b = _patches()
    run = np.empty((3, *a.shape), np.uint8)
    fill_between(a, b, run)
    for i, t in enumerate([0.25, 0.5, 0.75]):
        assert np.array_equal(run[i], crossfade(a, b, t))
    dist_a = [np.abs(frame.astype(int) - a).mean() for frame in run]
    assert dist_a == sorted(dist_a)  # moves steadily away from the left keyframe

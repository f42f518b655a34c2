"""The MuseTalk page engine's feature windowing (lipstream/web/edge/musetalk/windows.js) against
lipstream/engines/musetalk/features.py's frame_windows, on random stacked states, run in Node."""

from __future__ import annotations

import numpy as np
import pytest
from js_parity import run_node

features = pytest.importorskip("lipstream.engines.musetalk.features")


def test_constants_and_encoder_steps_match() -> None:
    samples = [-5, 0, 319, 320, 321, 16000 * 7 + 13, 480000]
    got = run_node("musetalk_windows_parity.mjs", {"calls": [{"samples": s} for s in samples]})
    assert [r["steps"] for r in got["results"]] == [features.encoder_steps(s) for s in samples]
    names = ("STEPS_PER_FRAME", "WINDOW_STEPS", "WINDOW_START", "LOOKAHEAD_FRAMES", "SAMPLES_PER_STEP")
    assert got["constants"] == {name: getattr(features, name) for name in names}


def test_frame_windows_match_including_edges_offsets_and_missing_steps() -> None:
    rng = np.random.default_rng(11)
    n_states, dim = 3, 4
    total = 57  # encoder steps of the utterance
    cases = [  # (first frame, frames, steps held from offset, offset)
        (0, 29, total, 0),  # the whole utterance: zero padding before step 0 and after the last step
        (10, 5, 30, 14),  # streaming: only a slice of the states held
        (27, 3, 20, 40),  # the tail, windows leave the audio
        (5, 1, 10, 12),  # needs steps 6.. but only 12.. are held: refused on both sides
    ]
    calls, wants = [], []
    for first, n, held, offset in cases:
        states = rng.normal(size=(held, n_states, dim)).astype(np.float32)
        calls.append({"states": states.reshape(-1).tolist(), "stepSize": n_states * dim, "first": first,
                      "nFrames": n, "totalSteps": total, "offset": offset})  # fmt: skip
        try:
            wants.append(features.frame_windows(states, first, n, total, offset))
        except ValueError as exc:
            wants.append(exc)
    got = run_node("musetalk_windows_parity.mjs", {"calls": calls})["results"]
    for case, want, have in zip(cases, wants, got, strict=True):
        if isinstance(want, ValueError):
            assert "error" in have and "not held" in have["error"] and "not held" in str(want), (case, have)
        else:
            np.testing.assert_array_equal(np.asarray(have["windows"], np.float32).reshape(want.shape), want)
    assert isinstance(wants[-1], ValueError) and not (wants[0] == 0).all()

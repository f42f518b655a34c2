"""`lipstream eval lipsync`: aperture from the video alone against the speech envelope."""

from __future__ import annotations

import json

import numpy as np
import pytest

from lipstream.avatar.face_measures import INNER_LIP_PAIRS, lip_aperture
from lipstream.cli import main
from lipstream.evaluation.lipsync import ClosedRule, closed_threshold, lagged_correlations


def test_lag_search_finds_a_known_delay() -> None:
    rng = np.random.default_rng(0)
    env = np.convolve(rng.normal(size=300), np.ones(4) / 4, mode="same")
    aperture = np.concatenate([np.zeros(2), env[:-2]])  # mouth 2 frames late
    corr = lagged_correlations(env, aperture)
    assert max(corr, key=corr.get) == 2
    assert corr[2] > 0.99 and corr[0] < corr[2]


def test_aperture_is_scale_free_and_grows_with_the_lip_gap() -> None:
    rng = np.random.default_rng(1)
    face = rng.uniform(0, 200, size=(478, 2))
    face[33], face[263] = (50.0, 80.0), (150.0, 80.0)  # eye corners 100 px apart
    for upper, lower in INNER_LIP_PAIRS:
        face[upper], face[lower] = (100.0, 150.0), (100.0, 160.0)  # 10 px inner-lip gap
    assert lip_aperture(face) == pytest.approx(0.1)
    assert lip_aperture(face * 3.0 + 40.0) == pytest.approx(0.1)  # size and position free
    wider = face.copy()
    for _, lower in INNER_LIP_PAIRS:
        wider[lower, 1] += 10.0
    assert lip_aperture(wider) == pytest.approx(0.2)


def test_closed_baseline_ignores_brief_closures() -> None:
    rest = np.full(60, 0.12)
    speech = 0.12 + 0.1 * np.abs(np.sin(np.arange(100) / 3.0))
    speech[[20, 50, 80]] = 0.02  # single-frame bilabial closures below the rest pose
    baseline, threshold = closed_threshold(np.concatenate([rest, speech, rest]), ClosedRule())
    assert baseline == pytest.approx(0.12, abs=0.01)
    assert 0.12 < threshold < 0.2


@pytest.mark.slow
def test_rendered_speech_is_in_sync_and_closed_in_silence(small_avatar, tmp_path, capsys) -> None:
    from lipstream.engines.base import Speech
    from lipstream.engines.registry import create_engine
    from lipstream.render.offline import render_speech_to_mp4
    from lipstream.talk.voices.tts import create_tts

    said = create_tts("espeak").synthesize("Hello, my name is Bob. What a wonderful day.")
    pause = np.zeros(16000 // 2, dtype=np.float32)
    speech = Speech(np.concatenate([pause, said.pcm, pause]))
    mp4 = tmp_path / "talk.mp4"
    render_speech_to_mp4(small_avatar, create_engine("viseme"), speech, mp4)
    plot = tmp_path / "plot.png"
    assert main(["eval", "lipsync", str(mp4), "--json", "--plot", str(plot), "--no-progress"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["frames"] == speech.frame_count
    assert report["faces_found"] == report["frames"]
    assert report["correlation_best"] > 0.3
    assert abs(report["best_lag_frames"]) <= 2
    assert report["correlation_speech_lag0"] > 0.1  # inside speech too (weak: a 60 px face, H.264 noise)
    assert report["silent_frames"] >= 20
    # The 360x640 face is ~60 px wide: H.264 noise alone moves its tracked rest aperture by about the
    # closed margin, so a few silent frames read open here; the 90 % target is benchmarked at 1080x1920.
    assert report["silent_closed_share"] >= 0.85
    assert plot.stat().st_size > 10_000
    # --audio replaces the video's own track: a silent file makes every frame silent.
    wav = tmp_path / "silence.wav"
    import av

    with av.open(str(wav), "w") as out:
        stream = out.add_stream("pcm_s16le", rate=16000, layout="mono")
        frame = av.AudioFrame.from_ndarray(np.zeros((1, 16000 * 3), np.int16), format="s16", layout="mono")
        frame.sample_rate = 16000
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    assert main(["eval", "lipsync", str(mp4), "--audio", str(wav), "--json", "--no-progress"]) == 0
    quiet = json.loads(capsys.readouterr().out)
    assert quiet["silent_frames"] == quiet["frames"]


def test_bad_inputs_are_one_line_errors(tmp_path, capsys) -> None:
    assert main(["eval", "lipsync", str(tmp_path / "missing.mp4")]) == 2
    assert "video not found" in capsys.readouterr().err
    junk = tmp_path / "junk.mp4"
    junk.write_bytes(b"\x00" * 100)
    assert main(["eval", "lipsync", str(junk), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error:") and "\n" not in err

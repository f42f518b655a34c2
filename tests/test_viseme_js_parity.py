"""Stage-by-stage parity of the page's weight-free engine (lipstream/web/edge/viseme/*.js) with the Python
viseme engine (lipstream/engines/viseme, lipstream/audio/levels.py): each JS stage runs in Node on the same
generated inputs (espeak-ng speech, numpy signals) as its Python counterpart.

Tolerances: the Python stages compute in float32 (numpy 2 keeps float32 through rfft and the MLP), the JS ones
in float64 with float32 rounding where the Python stores float32, so values agree to float32 precision (about
1e-7; 1e-5 allowed where errors add up through the FFT and the MLP). Decisions (silent frames, gated closures)
must be identical, also for values exactly at a limit."""

from __future__ import annotations

import shutil
import subprocess
from types import SimpleNamespace

import numpy as np
import pytest
from js_parity import run_node

from lipstream.audio.decode import load_audio
from lipstream.audio.levels import SilenceDetector, frame_rms
from lipstream.audio.timeline import SAMPLES_PER_FRAME
from lipstream.engines.viseme import extractor as extractor_module
from lipstream.engines.viseme.acoustic import N_FFT, AcousticFrontEnd
from lipstream.engines.viseme.calibration import LEVELS, OpeningCurve
from lipstream.engines.viseme.extractor import ArticulationExtractor, StreamingArticulation
from lipstream.engines.viseme.geometry import GEOMETRY_DIM, MouthGeometry
from lipstream.engines.viseme.loudness import ease_to_rest, loudness, scale_opening
from lipstream.engines.viseme.warp import _interp_contour

FEATURE_ATOL = 1e-5  # acoustic rows and whole feature rows (measured: 5e-7 and 2e-7 on this speech)
SENTENCES = ("Maybe the weather will be warmer on Thursday, said Bob.", "Fine, thank you.")


@pytest.fixture(scope="module")
def engine():
    """The Python engine (audio-only features, as on the page)."""
    from lipstream.engines.viseme.engine import VisemeEngine

    return VisemeEngine(use_phonemes=False)


@pytest.fixture(scope="module")
def params(engine) -> dict:
    """engine.json's parameters, exactly as `lipstream export web` writes them for the page."""
    from lipstream.edge.web_export import viseme_parameters

    return viseme_parameters(engine)


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> np.ndarray:
    """Two espeak-ng sentences, the second quiet, with silences before, between and after (16 kHz float32)."""
    espeak = shutil.which("espeak-ng")
    if espeak is None:
        pytest.skip("espeak-ng is not installed")
    folder = tmp_path_factory.mktemp("viseme_parity")
    parts = [np.zeros(8000, np.float32)]
    for i, text in enumerate(SENTENCES):
        wav = folder / f"s{i}.wav"
        subprocess.run([espeak, "-w", str(wav), text], check=True, capture_output=True, timeout=60)
        parts += [load_audio(wav) * (1.0 if i == 0 else 0.08), np.zeros(4000 + 333 * i, np.float32)]
    return np.concatenate(parts).astype(np.float32)


def js(params: dict, *calls: dict) -> list:
    """Results of the JS stages for these calls (one Node process)."""
    return run_node("viseme_parity.mjs", {"params": params, "calls": list(calls)})


def rows3(values: list, n: int) -> np.ndarray:
    """A flat JS feature array as [n, 3]."""
    return np.asarray(values, np.float64).reshape(n, 3)


def random_feats(rng: np.random.Generator, n: int) -> np.ndarray:
    """Articulation rows [n, 4] float32 as the model gives them (no f/v column: it stays 0)."""
    feats = np.zeros((n, 4), np.float32)
    feats[:, 0] = rng.uniform(0, 1, n)
    feats[:, 1] = rng.uniform(-1, 1, n)
    feats[:, 2] = rng.uniform(0, 1, n)
    return feats


# ---- acoustic front end ----------------------------------------------------------------------------


def test_fft_power_spectrum_matches_numpy(params: dict, speech: np.ndarray) -> None:
    rng = np.random.default_rng(1)
    starts = rng.integers(0, speech.size - 400, 6)
    frames = [speech[s : s + 400].astype(np.float64) for s in starts] + [rng.normal(size=400), np.zeros(400)]
    frames.append(np.sin(np.arange(512) * 2 * np.pi * 37 / 512))  # a full-length pure tone
    got = js(params, *({"stage": "fft", "x": f.tolist(), "n": N_FFT} for f in frames))
    for frame, power in zip(frames, got, strict=True):
        want = np.abs(np.fft.rfft(frame, n=N_FFT)) ** 2
        np.testing.assert_allclose(power, want, rtol=0, atol=1e-9 * max(want.max(), 1e-30))


def test_window_and_mel_filterbank_match(params: dict, engine) -> None:
    front = engine.extractor.front_end
    window, fb = js(params, {"stage": "window"}, {"stage": "melFilterbank"})
    np.testing.assert_array_equal(np.asarray(window, np.float32), front._window)
    np.testing.assert_allclose(np.asarray(fb), front._fb, rtol=0, atol=1e-6)


def test_acoustic_frames_match(params: dict, engine, speech: np.ndarray) -> None:
    """Log-mel shape, level and level change per frame, also past both ends of the audio (zero padding)."""
    front: AcousticFrontEnd = engine.extractor.front_end
    n = speech.size // SAMPLES_PER_FRAME
    spans = [(0, n), (-4, 9), (n - 6, 10), (37, 1)]
    got = js(params, *({"stage": "acoustic", "pcm": speech.tolist(), "first": a, "n": k} for a, k in spans))
    for (first, count), values in zip(spans, got, strict=True):
        want = front.frames(speech, first, count)
        have = np.asarray(values).reshape(want.shape)
        np.testing.assert_allclose(have, want, rtol=0, atol=FEATURE_ATOL, err_msg=str((first, count)))


def test_frame_rms_and_silence_mask_match(params: dict, speech: np.ndarray) -> None:
    bounds = [(0, speech.size), (640 * 3 + 17, speech.size - 999), (1280, 1280 + 639), (0, 640)]
    levels = frame_rms(speech)
    # a configured threshold that float32 rounds down (float32(t) < t), as --silence-dbfs may give
    odd = next(t for t in np.arange(-42.3, -41.0, 0.1).tolist() if float(np.float32(t)) < t)
    thresholds = [(-45.0, 3), (-45.0, 1), (-30.0, 5), (odd, 2)]
    # levels exactly at a threshold's float32 value (Python compares float32 levels with a float32 threshold)
    edge = levels.copy()
    edge[5:9] = np.float32(odd)
    edge[20:23] = np.float32(-45.0)
    calls = [{"stage": "frameRms", "pcm": speech.tolist(), "start": a, "end": b} for a, b in bounds]
    masks = [(lv, t, m) for lv in (levels, edge) for t, m in thresholds]
    calls += [{"stage": "silentMask", "levels": lv.tolist(), "threshold": t, "min": m} for lv, t, m in masks]
    got = js(params, *calls)
    for (a, b), have in zip(bounds, got[: len(bounds)], strict=True):
        np.testing.assert_allclose(np.asarray(have, np.float32), frame_rms(speech[a:b]), rtol=0, atol=1e-4)
    for (lv, t, m), have in zip(masks, got[len(bounds) :], strict=True):
        want = SilenceDetector(threshold_dbfs=t, min_silent_frames=m).mask_from_levels(lv)
        assert np.asarray(have, bool).tolist() == want.tolist(), (t, m)


# ---- articulation model and smoothing ---------------------------------------------------------------


def test_model_matches_on_the_same_acoustic_rows(params: dict, engine, speech: np.ndarray) -> None:
    model = engine.extractor.model
    front = engine.extractor.front_end
    n = speech.size // SAMPLES_PER_FRAME
    acoustic = front.frames(speech, -model.before, n + model.before + model.after)
    short = acoustic[: model.context]  # exactly one window
    dim = front.dim
    calls = [{"stage": "model", "acoustic": a.reshape(-1).tolist(), "dim": dim} for a in (acoustic, short)]
    got = js(params, *calls)
    for rows, values in zip((acoustic, short), got, strict=True):
        want = model.predict(rows)
        np.testing.assert_allclose(rows3(values, len(want)), want, rtol=0, atol=2e-5)
    assert np.ptp(model.predict(acoustic)[:, 0]) > 0.3  # the speech really drove the outputs


def test_smoothing_matches(params: dict, engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """span()'s 3-tap smoothing alone: the model output is given, the loudness/silence stage skipped."""
    rng = np.random.default_rng(2)
    ex = ArticulationExtractor(engine.extractor.model)
    for k0, k1 in ((0, 30), (7, 8)):
        raw = random_feats(rng, k1 - k0 + 2)[:, :3]
        stub = SimpleNamespace(before=ex.model.before, after=ex.model.after, predict=lambda _a, raw=raw: raw)
        monkeypatch.setattr(ex, "model", stub)
        monkeypatch.setattr(ex, "_finish", lambda _pcm, feats, *_a: feats)
        want = ex.span(np.zeros(0, np.float32), k0, k1, k1)
        (values,) = js(params, {"stage": "smooth", "raw": raw.reshape(-1).tolist(), "k0": k0, "k1": k1})
        np.testing.assert_allclose(rows3(values, k1 - k0), want[:, :3], rtol=0, atol=1e-7)
        assert not want[:, 3].any()
    assert extractor_module._SMOOTH.tolist() == params["smooth"]


# ---- loudness, closure gate, easing ----------------------------------------------------------------


def test_loudness_matches(params: dict, engine, speech: np.ndarray) -> None:
    levels = frame_rms(speech)
    cases = [levels, levels[:1], levels[:6], levels[40:47], np.full(9, -120.0, np.float32)]
    got = js(params, *({"stage": "loudness", "levels": lv.tolist()} for lv in cases))
    for lv, have in zip(cases, got, strict=True):
        np.testing.assert_allclose(np.asarray(have), loudness(lv, engine.extractor.loud), rtol=0, atol=1e-7)


def test_closure_gate_matches(params: dict, engine) -> None:
    """Including closures and loudness exactly at the gate's limits (float32, as the extractor feeds them)."""
    gate = engine.extractor.closure_gate
    rng = np.random.default_rng(3)
    n = 400
    feats = random_feats(rng, n)
    loud = rng.uniform(0, 1, n).astype(np.float32)
    feats[:100:2, 2] = np.float32(gate.min_confidence)
    feats[1:100:2, 2] = np.nextafter(np.float32(gate.min_confidence), np.float32(0))
    loud[:100:3] = np.float32(gate.max_loudness)
    loud[1:100:3] = np.nextafter(np.float32(gate.max_loudness), np.float32(1))
    # the sure closures' own limits (a louder frame keeps a very confident closure), and full_at's scaling
    feats[100:200:2, 2] = np.float32(gate.sure)
    feats[101:200:2, 2] = np.nextafter(np.float32(gate.sure), np.float32(0))
    loud[100:200:3] = np.float32(gate.max_loudness_sure)
    loud[101:200:3] = np.nextafter(np.float32(gate.max_loudness_sure), np.float32(1))
    feats[200:220, 2] = np.float32(gate.full_at) + np.linspace(-0.1, 0.1, 20, dtype=np.float32)
    flat = feats[:, :3].reshape(-1).tolist()
    (values,) = js(params, {"stage": "gate", "feats": flat, "loud": loud.tolist()})
    want = gate.apply(feats, loud)
    np.testing.assert_array_equal(rows3(values, n), want[:, :3])


def test_scale_opening_matches(params: dict, engine) -> None:
    rng = np.random.default_rng(4)
    n = 300
    feats = random_feats(rng, n)
    feats[:20, 0] = np.linspace(0, 0.3, 20)  # around the 0.2 knee of the loudness share
    loud = rng.uniform(0, 1, n).astype(np.float32)
    loud[::7] = 0
    flat = feats[:, :3].reshape(-1).tolist()
    (values,) = js(params, {"stage": "scale", "feats": flat, "loud": loud.tolist()})
    want = scale_opening(feats, loud, engine.extractor.loud)
    np.testing.assert_allclose(rows3(values, n), want[:, :3], rtol=0, atol=1e-6)


def test_ease_to_rest_matches(params: dict, engine) -> None:
    cfg = engine.extractor.loud
    e = cfg.ease_frames
    rng = np.random.default_rng(5)
    calls, wants = [], []
    for n, p in ((60, 0.3), (60, 0.0), (12, 1.0), (1, 0.5), (40, 0.7)):
        feats = random_feats(rng, n)
        silent = rng.uniform(0, 1, n + 2 * e) < p
        calls.append({"stage": "ease", "feats": feats[:, :3].reshape(-1).tolist(), "silent": silent.tolist()})
        wants.append(ease_to_rest(feats, silent, cfg))
    for want, values in zip(wants, js(params, *calls), strict=True):
        np.testing.assert_allclose(rows3(values, len(want)), want[:, :3], rtol=0, atol=1e-7)


def test_finish_matches_on_speech(params: dict, engine, speech: np.ndarray) -> None:
    """Gate, loudness scaling, easing and silent rows together on real levels, whole and streamed spans."""
    ex = engine.extractor
    n = speech.size // SAMPLES_PER_FRAME
    rng = np.random.default_rng(6)
    cases = [(0, n, n, 0), (10, 40, n, 0), (30, 55, 60, 0), (50, 70, n, 20), (n - 3, n, n, 0)]
    calls, wants = [], []
    for k0, k1, known, offset in cases:
        feats = random_feats(rng, k1 - k0)
        pcm = speech[offset * SAMPLES_PER_FRAME : known * SAMPLES_PER_FRAME]
        wants.append(ex._finish(pcm, feats, k0, k1, known, offset))
        calls.append({"stage": "finish", "pcm": pcm.tolist(), "feats": feats[:, :3].reshape(-1).tolist(),
                      "k0": k0, "k1": k1, "known": known, "offset": offset})  # fmt: skip
    for want, values, case in zip(wants, js(params, *calls), cases, strict=True):
        have = rows3(values, len(want))
        np.testing.assert_allclose(have, want[:, :3], rtol=0, atol=1e-6, err_msg=str(case))
    paused = (wants[0][:, :2] == 0).all(axis=1) & (wants[0][:, 2] == 1)  # silence: lips closed, nothing else
    assert paused.any() and (wants[0][:, 0] > 0.1).any()  # pauses and openings


# ---- the whole feature path, batch and streaming ---------------------------------------------------


def test_span_matches_end_to_end(params: dict, engine, speech: np.ndarray) -> None:
    ex = engine.extractor
    n = speech.size // SAMPLES_PER_FRAME
    cases = [(0, n, n, 0), (25, 45, 60, 0), (40, 50, n, 30)]
    calls = [
        {"stage": "span", "pcm": speech[o * SAMPLES_PER_FRAME : kn * SAMPLES_PER_FRAME].tolist(),
         "k0": k0, "k1": k1, "known": kn, "offset": o}
        for k0, k1, kn, o in cases
    ]  # fmt: skip
    for (k0, k1, known, offset), values in zip(cases, js(params, *calls), strict=True):
        want = ex.span(speech[offset * SAMPLES_PER_FRAME : known * SAMPLES_PER_FRAME], k0, k1, known, offset)
        have = rows3(values, k1 - k0)
        np.testing.assert_allclose(have, want[:, :3], rtol=0, atol=FEATURE_ATOL)
        assert ((have == 0).all(axis=1) == (want == 0).all(axis=1)).all()  # the same frames rest
    assert params["lookahead_frames"] == ex.lookahead_frames
    assert params["lookback_frames"] == ex.lookback_frames


def test_streaming_matches_chunk_for_chunk(params: dict, engine, speech: np.ndarray) -> None:
    rng = np.random.default_rng(7)
    chunks = []
    while sum(chunks) < speech.size:
        chunks.append(int(rng.choice([1, 160, 640, 999, 4096, 12000])))
    (got,) = js(params, {"stage": "stream", "pcm": speech.tolist(), "chunks": chunks})
    stream = StreamingArticulation(engine.extractor)
    at, first = 0, 0
    py = []
    for size in chunks:
        py.append(stream.push(speech[at : at + size]))
        at += size
    py.append(stream.finish())
    assert len(got) == len(py)
    for want, have in zip(py, got, strict=True):
        assert have["first"] == first
        np.testing.assert_allclose(rows3(have["rows"], len(want)), want[:, :3], rtol=0, atol=FEATURE_ATOL)
        first += len(want)
    assert first == speech.size // SAMPLES_PER_FRAME


# ---- calibration and warp geometry ------------------------------------------------------------------


def test_warp_opening_matches(params: dict) -> None:
    rng = np.random.default_rng(8)
    levels = np.asarray(LEVELS, np.float32)
    measured = np.sqrt(levels) * 3.0 + rng.normal(0, 0.05, levels.size)
    measured[3:5] = measured[2]  # a flat stretch
    measured[6] = measured[5] - 0.2  # and a dip (noise)
    curves = [
        OpeningCurve(levels, measured.astype(np.float32)),
        OpeningCurve.identity(),
        OpeningCurve(levels, np.full(levels.size, 0.7, np.float32)),  # flat: commands pass through
    ]
    commands = np.concatenate([np.linspace(-0.2, 1.2, 57), rng.uniform(0, 1, 40)]).astype(np.float32)
    calls = [
        {"stage": "warpOpening", "curve": {"levels": c.levels.tolist(), "aperture": c.aperture.tolist()},
         "commands": commands.tolist()}
        for c in curves
    ]  # fmt: skip
    xp = np.sort(rng.uniform(0, 10, 12))
    fp = rng.normal(size=12)
    xs = np.concatenate([[-1.0, xp[0], xp[-1], 11.0], xp, rng.uniform(-1, 11, 50)])
    calls.append({"stage": "interp", "xs": xs.tolist(), "xp": xp.tolist(), "fp": fp.tolist()})
    got = js(params, *calls)
    for curve, have in zip(curves, got[: len(curves)], strict=True):
        np.testing.assert_allclose(have, curve.warp_opening(commands), rtol=0, atol=1e-6)
    np.testing.assert_allclose(got[-1], np.interp(xs, xp, fp), rtol=0, atol=1e-12)


def test_geometry_unpack_and_contour_interpolation_match(params: dict) -> None:
    rng = np.random.default_rng(9)
    row = rng.uniform(60, 200, GEOMETRY_DIM).astype(np.float32)
    contour = np.stack([rng.permutation(np.linspace(90, 170, 11)), rng.uniform(140, 160, 11)], axis=1)
    contour = contour.astype(np.float32)
    xs = np.concatenate([[80.0, 90.0, 170.0, 180.0], rng.uniform(85, 175, 60)]).astype(np.float32)
    geo_js, contour_js = js(
        params,
        {"stage": "unpackGeometry", "row": row.tolist()},
        {"stage": "interpContour", "contour": contour.tolist(), "xs": xs.tolist()},
    )
    geo = MouthGeometry.unpack(row)
    np.testing.assert_array_equal(np.asarray(geo_js["upper"], np.float32), geo.upper)
    np.testing.assert_array_equal(np.asarray(geo_js["lower"], np.float32), geo.lower)
    fields = ("centerX", "halfWidth", "upperOuterY", "lowerOuterY", "chinY", "noseY", "lipY")
    py_fields = ("center_x", "half_width", "upper_outer_y", "lower_outer_y", "chin_y", "nose_y", "lip_y")
    assert [geo_js[f] for f in fields] == [getattr(geo, f) for f in py_fields]
    np.testing.assert_allclose(contour_js, _interp_contour(contour, xs), rtol=0, atol=1e-4)



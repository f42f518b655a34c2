"""The in-browser MuseTalk engine (lipstream/web/edge/musetalk) in headless Chromium, against Python.

The served folder is built here: the engine's modules and onnxruntime-web files as the export copies
them, the tiny same-topology graphs from `lipstream export onnx` (fp32 and fp16), reference latents,
masks and a codebook seed, behind a plain `python -m http.server` (no lipstream process).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from server_harness import BROWSER_DIR, run_browser_script

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
ENGINE_DIR = REPO / "lipstream" / "web" / "edge" / "musetalk"
SCRIPT = "edge_musetalk.mjs"
N_SOURCE = 6  # source frames in the fixture avatar
# 0.5 s of silence, then 0.4 s of speech: 22 frames, 4 keyframes (two UNet batches as the planner releases
# them) on SwiftShader's WebGPU (60-80 s a batch here, after ~100 s of warm-up), with infill and silence
SHORT_SAMPLES = 14400
# 0.5 s of silence, then 1.5 s of speech (50 frames): what the wasm engine runs render (37-49 s a test
# here, 52-66 s with the whole 6.5 s clip; the rest is the page's and onnxruntime-web's start)
MEDIUM_SAMPLES = 32000
HARNESS = "<!doctype html><meta charset=utf-8><title>musetalk harness</title><link rel=icon href='data:,'>\n"
TEXT = "The quick brown fox jumps over the lazy dog. Lip sync runs in the browser now."


def _f32(data: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(data), dtype="<f4")


def _u32(data: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(data), dtype="<u4")


def _rgba(data: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(data), dtype=np.uint8).reshape(256, 256, 4)


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> np.ndarray:
    """Real speech from espeak-ng, decoded and resampled to 16 kHz float32, with silence around it."""
    from lipstream.audio.decode import load_audio

    wav = tmp_path_factory.mktemp("speech") / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(wav), TEXT], check=True)
    pcm = np.asarray(load_audio(wav), dtype=np.float32).reshape(-1)
    pad = np.zeros(8000, np.float32)
    return np.concatenate([pad, pcm, pad])


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> Path:
    """The tiny same-topology MuseTalk v1.5 models (random weights) in the upstream layout."""
    from lipstream.engines.musetalk.topology import write_model_folder

    return write_model_folder(tmp_path_factory.mktemp("tiny_models") / "models", versions=("1.5",), tiny=True)


@pytest.fixture(scope="module")
def tiny_onnx(tmp_path_factory, tiny_models) -> dict[str, Path]:
    """`lipstream export onnx` of the tiny same-topology models, fp32 and fp16 (batch 4)."""
    from lipstream.edge.onnx_export import OnnxExportConfig, export_onnx

    root = tmp_path_factory.mktemp("tiny_onnx")
    out = {}
    for dtype in ("float32", "float16"):
        export_onnx(OnnxExportConfig(models_dir=tiny_models, dtype=dtype, batch=4), root / dtype)
        out[dtype] = root / dtype
    return out


def _sha(path: Path) -> dict:
    data = path.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _mask(i: int) -> np.ndarray:
    """A feathered lower-face ellipse, shifted per source frame so the alpha lane shows which mask went in."""
    mask = np.zeros((256, 256), np.uint8)
    cv2.ellipse(mask, (128 + 4 * i, 190), (70, 40), 0, 0, 360, 255, -1)
    return cv2.GaussianBlur(mask, (21, 21), 0)


def _states(onnx_dir: Path, pcm: np.ndarray) -> np.ndarray:
    """Python's path: the extractor's log-mel, the exported Whisper graph on onnxruntime, per 30 s segment."""
    import onnxruntime as ort
    from transformers import WhisperFeatureExtractor

    from lipstream.engines.musetalk.features import SEGMENT_SAMPLES, encoder_steps

    extractor = WhisperFeatureExtractor(feature_size=80)
    session = ort.InferenceSession(str(onnx_dir / "whisper_encoder.onnx"), providers=["CPUExecutionProvider"])
    parts = []
    for start in range(0, len(pcm), SEGMENT_SAMPLES):
        mel = extractor(
            pcm[start : start + SEGMENT_SAMPLES], sampling_rate=16000, return_tensors="np"
        ).input_features
        parts.append(session.run(None, {"mel": mel.astype(np.float32)})[0][0])
    return np.concatenate(parts)[: encoder_steps(len(pcm))]


def _features(onnx_dir: Path, pcm: np.ndarray) -> np.ndarray:
    from lipstream.audio.timeline import frame_count
    from lipstream.engines.musetalk.features import frame_windows

    states = _states(onnx_dir, pcm)
    return frame_windows(states, 0, frame_count(len(pcm)), total_steps=len(states))


@pytest.fixture(scope="module")
def site(tmp_path_factory, tiny_onnx, speech) -> Path:
    """The served folder: engine modules, ORT runtime, fixtures and a minimal export.json."""
    from lipstream.edge.codebook_seed import write_codebook_seed
    from lipstream.edge.web_export import write_image_pack
    from lipstream.render.codebook import SimHashCodebook

    root = tmp_path_factory.mktemp("site")
    engine = root / "musetalk"
    engine.mkdir()
    for js in ENGINE_DIR.glob("*.js"):
        shutil.copyfile(js, engine / js.name)
    for dest, src in json.loads((ENGINE_DIR / "assets.json").read_text()).items():
        if not (ENGINE_DIR / src).is_file():
            pytest.fail(f"{ENGINE_DIR / src} is missing: run `npm install` in {ENGINE_DIR} (make setup does)")
        (engine / dest).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ENGINE_DIR / src, engine / dest)
    (root / "harness.html").write_text(HARNESS)

    fixtures = root / "fixtures"
    fixtures.mkdir()
    speech.astype("<f4").tofile(fixtures / "pcm.f32")
    speech[:SHORT_SAMPLES].astype("<f4").tofile(fixtures / "short.f32")  # for SwiftShader, ~100x slower
    speech[:MEDIUM_SAMPLES].astype("<f4").tofile(fixtures / "medium.f32")  # for wasm
    feats = _features(tiny_onnx["float32"], speech)
    feats.astype("<f4").tofile(fixtures / "features.f32")
    book = SimHashCodebook(feats.shape[1], bits=64, seed=0, max_entries=64, threshold=2)
    book.hyperplanes.astype("<f4").tofile(fixtures / "hyperplanes.f32")
    rng = np.random.default_rng(1)
    np.round(rng.uniform(0, 255, (2, 3, 256, 256))).astype("<f4").tofile(fixtures / "rgb.f32")

    data = root / "data" / "musetalk"
    data.mkdir(parents=True)
    latents = rng.standard_normal((N_SOURCE, 8, 32, 32)).astype("<f2")
    latents.tofile(data / "latents.f16")
    offsets = write_image_pack((cv2.imencode(".png", _mask(i))[1].tobytes() for i in range(N_SOURCE)),
                               root / "data" / "masks.pngs")  # fmt: skip
    variants = {}
    for dtype, folder in tiny_onnx.items():
        shutil.copytree(folder, data / f"onnx-{dtype}")
        manifest = json.loads((folder / "manifest.json").read_text())
        variants[dtype] = {"folder": f"data/musetalk/onnx-{dtype}", "manifest": manifest}
    seed = write_codebook_seed(book, data / "codebook.bin", root)
    export = {
        "name": "tiny",
        "loop": {"frames": [0, 1, 2, 3, 4, 5, 4, 3, 2, 1]},
        "masks": {"file": "data/masks.pngs", "format": "png", "offsets": offsets},
        "musetalk": {
            "onnx": {"variants": variants},
            "latents": {
                "file": "data/musetalk/latents.f16",
                "dtype": "float16",
                "shape": list(latents.shape),
            },
            "codebook": seed,
        },
    }
    export["files"] = {
        p.relative_to(root).as_posix(): _sha(p) for p in sorted((root / "data").rglob("*")) if p.is_file()
    }
    (root / "export.json").write_text(json.dumps(export))
    return root


def _serve(folder: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "-d", str(folder)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def server(site):
    """A plain static server (python -m http.server) on the site; no lipstream process behind it."""
    proc, url = _serve(site)
    yield url
    proc.terminate()
    proc.wait(10)


def _run(url: str, scenario: str, timeout: float = 300, quiet: bool = True, **options) -> dict:
    assert (BROWSER_DIR / SCRIPT).is_file()
    result = run_browser_script(SCRIPT, {"url": url, "scenario": scenario, **options}, timeout)
    if quiet:
        assert not result.get("problems"), result["problems"]
    return result


def test_log_mel_matches_python_extractor(server, speech):
    """JS log-mel of real espeak-ng speech equals WhisperFeatureExtractor's within 1e-4."""
    from transformers import WhisperFeatureExtractor

    result = _run(server, "mel")
    js = _f32(result["mel"]).reshape(80, 3000)
    py = WhisperFeatureExtractor(feature_size=80)(
        speech, sampling_rate=16000, return_tensors="np"
    ).input_features[0]
    diff = np.abs(js - py)
    assert diff.max() <= 1e-4, f"max abs diff {diff.max():.2e}"
    assert py.std() > 0.1  # real speech, not padding only


def test_planner_codebook_infill_decisions_match_python(server, site, speech):
    """Silence, keyframes (two chunks), SimHash codes, codebook hits, cross-fades and packing as in Python."""
    from lipstream.audio.levels import SilenceDetector
    from lipstream.render.accel import speaking_mask
    from lipstream.render.codebook import SimHashCodebook
    from lipstream.render.infill import CrossFader
    from lipstream.render.planner import KeyframePlanner

    feats = np.fromfile(site / "fixtures" / "features.f32", dtype="<f4")
    n = len(speech) // 640
    feats = feats.reshape(n, -1)
    result = _run(server, "decisions", dim=feats.shape[1])

    silent = SilenceDetector().silent_mask(speech)
    skip = ~speaking_mask(silent)
    assert result["silent"] == silent.astype(int).tolist()
    assert result["skip"] == skip.astype(int).tolist()
    assert 0 < skip.sum() < n  # the fixture has both silence and speech

    planner = KeyframePlanner()
    half = n // 2
    from lipstream.render.planner import Plan

    plan = Plan.concat(
        [planner.plan(feats[:half], skip[:half]), planner.plan(feats[half:], skip[half:]), planner.finish()]
    )
    js_plan = result["plan"]
    assert [d["index"] for d in js_plan] == plan.index.tolist()
    assert [d["kind"] for d in js_plan] == plan.kind.tolist()
    assert [d["left"] for d in js_plan] == plan.left.tolist()
    assert [d["right"] for d in js_plan] == plan.right.tolist()
    assert np.allclose([d["weight"] for d in js_plan], plan.weight, atol=1e-6)
    assert result["threshold"] == pytest.approx(planner.config.velocity_threshold, rel=1e-5)
    assert (plan.kind == 1).sum() < (plan.kind != 0).sum()  # infill frames exist: the planner is doing work

    book = SimHashCodebook(feats.shape[1], bits=64, seed=0, max_entries=8, threshold=12)
    codes = book.hash(feats)
    js_codes = np.array(result["codes"], dtype=np.uint64).reshape(-1, 2)
    js_codes = js_codes[:, 0] | (js_codes[:, 1] << np.uint64(32))
    assert np.array_equal(js_codes, codes)
    hits = []
    for i, code in enumerate(codes):
        found = book.lookup(code)
        hits.append([found.entry, found.distance])
        if found.patch is None:
            book.insert(code, np.full((2, 2, 1), i % 256, np.uint8))
    assert result["hits"] == hits
    assert any(entry >= 0 for entry, _ in hits) and book.evictions > 0  # hits and evictions happened

    rgb = np.fromfile(site / "fixtures" / "rgb.f32", dtype="<f4").reshape(2, 3, 256, 256)
    a, b = (_rgba(p) for p in result["packed"])
    for img, src in ((a, rgb[0]), (b, rgb[1])):
        assert np.array_equal(img[..., :3], src.transpose(1, 2, 0).astype(np.uint8))
        assert (img[..., 3] == 255).all()
    fader = CrossFader((256, 256, 3))
    for t, fade in zip([0, 0.25, 1 / 3, 0.5, 0.75, 1], result["fades"], strict=True):
        expected = fader.blend(a[..., :3].copy(), b[..., :3].copy(), t, np.empty((256, 256, 3), np.uint8))
        assert np.array_equal(_rgba(fade)[..., :3], expected), f"cross-fade differs at t={t}"


def _python_patches(
    onnx_dir: Path, site: Path, speech: np.ndarray, items: list[tuple[int, int]]
) -> np.ndarray:
    """Python onnxruntime UNet + VAE on the same features and latents, batch 4 (tail padded)."""
    import onnxruntime as ort

    feats = _features(onnx_dir, speech)
    latents = np.fromfile(site / "data" / "musetalk" / "latents.f16", dtype="<f2").reshape(
        N_SOURCE, 8, 32, 32
    )
    manifest = json.loads((onnx_dir / "manifest.json").read_text())
    half = manifest["dtype"] == "float16"
    dt = np.float16 if half else np.float32
    unet = ort.InferenceSession(str(onnx_dir / "unet.onnx"), providers=["CPUExecutionProvider"])
    vae = ort.InferenceSession(str(onnx_dir / "vae_decoder.onnx"), providers=["CPUExecutionProvider"])
    out = []
    for start in range(0, len(items), 4):
        chunk = items[start : start + 4]
        chunk = chunk + [chunk[-1]] * (4 - len(chunk))
        lat = np.stack([latents[s].astype(np.float32) for _, s in chunk]).astype(dt)
        audio_shape = next(i["shape"] for i in manifest["graphs"]["unet"]["inputs"] if i["name"] == "audio")
        aud = np.stack([feats[f].reshape(audio_shape[1:]) for f, _ in chunk]).astype(dt)
        pred = unet.run(None, {"latents": lat, "audio": aud})[0]
        rgb = vae.run(None, {"latents": pred})[0].astype(np.float32)
        out.extend(rgb[: min(4, len(items) - start)])
    return np.stack(out).transpose(0, 2, 3, 1)


@pytest.mark.parametrize(
    ("backend", "dtype"), [("webgpu", "float32"), ("wasm", "float32"), ("wasm", "float16")]
)
def test_engine_matches_python_onnxruntime(server, site, tiny_onnx, speech, backend, dtype):
    """The Worker's keyframe patches (codebook off) equal Python onnxruntime's on the same inputs; infill,
    masks and silence are where they belong; each session saw exactly one input shape."""
    clip = "short" if backend == "webgpu" else "medium"
    speech = speech[:SHORT_SAMPLES] if clip == "short" else speech[:MEDIUM_SAMPLES]
    # no warm-up pass: on SwiftShader it is a whole Whisper run (~17 s alone); the other tests here warm up
    engine = {"backend": backend, "dtype": dtype, "codebook": False, "warmup": False}
    if backend == "webgpu":
        # SwiftShader (the only WebGPU here) runs the tiny VAE decoder for minutes, the UNet for 2-3 minutes
        # a batch on a loaded 2-core box: Whisper on WebGPU (its states feed every patch compared below);
        # LIPSTREAM_TEST_WEBGPU_UNET=1 puts the UNet there too, for a machine with a real GPU adapter.
        engine["graphBackends"] = {"vae_decoder": "wasm"}
        if os.environ.get("LIPSTREAM_TEST_WEBGPU_UNET") != "1":
            engine["graphBackends"]["unet"] = "wasm"
    result = _run(server, "engine", pcm=f"/fixtures/{clip}.f32", engine=engine)
    print({k: result[k] for k in ("info", "readyMs", "runMs")}, result["stats"]["timing"])
    assert "error" not in result, result.get("error")
    assert result["info"]["backend"] == backend and result["info"]["dtype"] == dtype
    patches = result["patches"]
    n = len(speech) // 640
    assert [p["frame"] for p in patches] == list(range(n)) and patches[-1]["last"]
    assert result["stats"]["distinctShapes"] == {"whisper_encoder": 1, "unet": 1, "vae_decoder": 1}
    if backend == "webgpu":
        # the smallest clip that still renders: 4 keyframes, released in two steps as the planner settles
        assert result["stats"]["timing"]["count"]["unet_batch"] <= 2
    keys = [p for p in patches if p["kind"] == 1]
    assert keys and any(p["kind"] == 2 for p in patches) and any(p["rgba"] is None for p in patches)
    assert result["stats"]["scheduler"]["neuralFrames"] == len(keys)
    expected = _python_patches(tiny_onnx[dtype], site, speech, [(p["frame"], p["sourceFrame"]) for p in keys])
    got = np.stack([_rgba(p["rgba"]) for p in keys])
    diff = np.abs(got[..., :3].astype(int) - expected.astype(int))
    tolerance = 2 if dtype == "float16" else 1
    assert diff.max() <= tolerance, f"max {diff.max()} grey levels, mean {diff.mean():.3f}"
    for p in keys[:3]:
        assert np.array_equal(_rgba(p["rgba"])[..., 3], _mask(p["sourceFrame"]))
    loop = [0, 1, 2, 3, 4, 5, 4, 3, 2, 1]
    assert all(p["sourceFrame"] == loop[p["frame"] % 10] for p in patches)


def test_codebook_persists_across_reload(server):
    """First run fills the codebook from the export's seed and saves it; after a reload the same speech
    is served from IndexedDB with fewer engine passes."""
    engine = {"backend": "wasm", "dtype": "float32"}
    result = _run(server, "reload", pcm="/fixtures/medium.f32", engine=engine)
    first, second = result["first"], result["second"]
    assert first["info"]["codebookSource"] == "new"
    assert second["info"]["codebookSource"] == "IndexedDB"
    assert second["info"]["codebookEntries"] == first["stats"]["codebookEntries"] > 0
    assert second["stats"]["scheduler"]["neuralFrames"] == 0
    assert first["stats"]["scheduler"]["neuralFrames"] > 0


@pytest.mark.parametrize("damage", ["missing", "corrupted"])
def test_bad_model_file_names_the_file(tmp_path, site, damage):
    """A missing or corrupted graph fails `ready` with a message naming the file (no hang)."""
    broken = tmp_path / "site"
    shutil.copytree(site, broken)
    target = broken / "data" / "musetalk" / "onnx-float32" / "unet.onnx"
    if damage == "missing":
        target.unlink()
    else:
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0xFF
        target.write_bytes(bytes(data))
    proc, url = _serve(broken)
    try:
        start = time.monotonic()
        result = _run(url, "engine", timeout=120, quiet=False, engine={"backend": "wasm", "dtype": "float32"})
    finally:
        proc.terminate()
        proc.wait(10)
    assert "onnx-float32/unet.onnx" in result["error"]
    assert ("missing" if damage == "missing" else "sha256") in result["error"]
    assert time.monotonic() - start < 60


def test_web_export_ships_both_precisions_and_seeds_the_engine_with_the_avatars_codebook(
    small_avatar, tiny_models, tiny_onnx, speech, tmp_path
):
    """`lipstream export web --engine musetalk --onnx fp16 --onnx fp32` ships both graph folders and the
    avatar's Python codebook as the seed; the exported page's engine loads it and needs fewer engine
    passes on speech the avatar was seeded with than an export of the same avatar without a codebook."""
    from lipstream.audio.levels import SilenceDetector
    from lipstream.audio.speech import Speech
    from lipstream.avatar.bundle import load_avatar
    from lipstream.cli import main
    from lipstream.engines.registry import create_engine
    from lipstream.render.accel import speaking_mask
    from lipstream.render.seed import seed_codebook

    speech = speech[:MEDIUM_SAMPLES]  # 2 s: both runs of the page's engine render it (52-66 s for 6.5 s)
    avatars = tmp_path / "avatars"
    shutil.copytree(small_avatar.path, avatars / "small")  # the session's avatar stays without latents
    bundle = load_avatar("small", avatars)
    engine = create_engine(
        "musetalk", models_dir=str(tiny_models), version="1.5", device="cpu", dtype="float32", batch_size=4
    )
    engine.prepare(bundle)
    onnx = ["--onnx", str(tiny_onnx["float16"]), "--onnx", str(tiny_onnx["float32"])]
    export = ["export", "web", "small", "--avatars-dir", str(avatars), "--engine", "musetalk", *onnx]
    assert main([*export, "-o", str(tmp_path / "plain")]) == 0
    seeded = seed_codebook(bundle, engine, [Speech(speech)])
    assert seeded.entries > 0
    assert main([*export, "-o", str(tmp_path / "seeded")]) == 0

    runs = {}
    for name in ("plain", "seeded"):
        site = tmp_path / name
        manifest = json.loads((site / "export.json").read_text())
        mt = manifest["musetalk"]
        assert sorted(mt["onnx"]["variants"]) == ["float16", "float32"]
        for dtype, variant in mt["onnx"]["variants"].items():
            assert variant["manifest"]["dtype"] == dtype
            assert (site / variant["folder"] / "unet.onnx").is_file()
        book = mt["codebook"]
        assert book["entries"] == (seeded.entries if name == "seeded" else 0)
        assert book["dim"] == engine.feature_dim and book["file"] in manifest["files"]
        # the harness page and the speech, served beside the export
        (site / "harness.html").write_text(HARNESS)
        speech.astype("<f4").tofile(site / "speech.f32")
        proc, url = _serve(site)
        try:
            engine_opts = {"backend": "wasm", "dtype": "float32", "persist": False}
            runs[name] = _run(url, "engine", pcm="/speech.f32", engine=engine_opts)
        finally:
            proc.terminate()
            proc.wait(10)
    plain, seed = runs["plain"], runs["seeded"]
    assert plain["info"]["codebookSource"] == "new" and plain["info"]["codebookEntries"] == 0
    assert seed["info"]["codebookSource"] == "export seed"
    assert seed["info"]["codebookEntries"] == seeded.entries
    frames = len(speech) // 640
    silent = SilenceDetector().silent_mask(speech)[:frames]
    passes = {k: r["stats"]["scheduler"]["neuralFrames"] for k, r in runs.items()}
    per_frame = {k: round(v / frames, 3) for k, v in passes.items()}
    print(f"engine passes per frame: {per_frame}")
    for r in runs.values():  # the engine leaves the same frames to the base video as Python's scheduler
        assert r["stats"]["scheduler"]["silentFrames"] == int((~speaking_mask(silent)).sum())
    for r in runs.values():
        assert [p["frame"] for p in r["patches"]] == list(range(frames))
    assert passes["seeded"] < passes["plain"] / 2, passes

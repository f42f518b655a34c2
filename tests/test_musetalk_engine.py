"""MuseTalk engine end to end on tiny same-topology weights: latents, fixed batches, patches, CLI render."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from lipstream.avatar.bundle import load_avatar
from lipstream.engines.base import Engine, Speech
from lipstream.engines.musetalk.generator import unfreeze_time
from lipstream.engines.musetalk.latents import LATENTS_FILE, crop_face, vae_inputs
from lipstream.engines.musetalk.topology import write_model_folder
from lipstream.engines.registry import create_engine
from lipstream.errors import AvatarError, LipstreamError

pytestmark = pytest.mark.slow  # tiny MuseTalk models built and run in torch, latents prepared

ENGINE_OPTS = {"device": "cpu", "dtype": "float32", "batch_size": 4}


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny random MuseTalk v1.5 weights in the upstream layout."""
    return write_model_folder(tmp_path_factory.mktemp("models"), versions=("1.5",))


@pytest.fixture(scope="module")
def engine(tiny_models: Path):
    """The engine as the registry builds it."""
    return create_engine("musetalk", models_dir=tiny_models, version="1.5", **ENGINE_OPTS)


@pytest.fixture(scope="module")
def avatar(small_avatar, tmp_path_factory: pytest.TempPathFactory):
    """A private copy of the shared small avatar (these tests write engine caches into it)."""
    folder = shutil.copytree(small_avatar.path, tmp_path_factory.mktemp("avatars") / "small")
    return load_avatar(folder)


def test_engine_contract(engine) -> None:
    assert isinstance(engine, Engine)
    assert (engine.name, engine.feature_kind, engine.patch_size) == ("musetalk", "whisper", 256)
    assert engine.feature_dim == 10 * 5 * 64  # 10 steps x 5 states x d_model (19200 at full size)
    assert engine.batch_size == 4 and engine.lookahead_frames == 2


def test_vae_inputs_mask_the_lower_half() -> None:
    crops = np.random.default_rng(0).integers(0, 256, (2, 256, 256, 3), dtype=np.uint8)
    masked, ref = vae_inputs(crops)
    assert masked.shape == ref.shape == (2, 3, 256, 256)
    assert torch.all(masked[:, :, 128:] == -1)
    torch.testing.assert_close(masked[:, :, :128], ref[:, :, :128])
    torch.testing.assert_close(
        ref[0, 0, 5, 7], torch.tensor(crops[0, 5, 7, 0] / 255 * 2 - 1, dtype=torch.float32)
    )


def test_crop_keeps_rgb_order(avatar) -> None:
    frame = np.zeros((100, 120, 3), np.uint8)
    frame[..., 0] = 200  # pure red in RGB
    crop = crop_face(frame, np.array([10, 20, 90, 80]))
    assert crop.shape == (256, 256, 3)
    assert crop[..., 0].min() == 200 and crop[..., 1:].max() == 0
    real = crop_face(np.asarray(avatar.frames[0]), avatar.boxes[0])
    x1, y1, x2, y2 = avatar.boxes[0]
    region = np.asarray(avatar.frames[0])[y1:y2, x1:x2].reshape(-1, 3).mean(0)
    np.testing.assert_allclose(real.reshape(-1, 3).mean(0), region, atol=3)


def test_prepare_stores_latents_once(engine, avatar) -> None:
    engine.prepare(avatar)
    path = avatar.engine_dir("musetalk") / LATENTS_FILE
    latents = np.load(path)
    assert latents.shape == (avatar.frame_count, 8, 32, 32) and latents.dtype == np.float16
    assert not np.allclose(latents[:, :4], latents[:, 4:])  # masked and reference crops differ
    entry = load_avatar(avatar.path).manifest.engines["musetalk"]
    assert entry["latents"] == LATENTS_FILE and entry["posterior"] == "mean"
    mtime = path.stat().st_mtime_ns
    engine.prepare(avatar)
    assert path.stat().st_mtime_ns == mtime  # idempotent
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp files left


def test_render_uses_one_fixed_batch_shape(engine, avatar) -> None:
    speech = Speech(np.random.default_rng(2).normal(0, 0.1, 16_000).astype(np.float32))
    feats = engine.features(speech)
    assert feats.shape == (25, engine.feature_dim)
    shapes: list[tuple] = []
    hook = engine.generator.unet.register_forward_pre_hook(
        lambda _m, args: shapes.append(tuple(args[0].shape))
    )
    try:
        ids = np.array([0, 3, 7, 11, 49])
        patches = engine.render(avatar, feats[:5], ids)
    finally:
        hook.remove()
    assert patches.shape == (5, 256, 256, 3) and patches.dtype == np.uint8
    assert shapes == [(4, 8, 32, 32), (4, 8, 32, 32)]  # 5 frames -> two batches of 4, the last padded
    one_by_one = np.concatenate([engine.render(avatar, feats[i : i + 1], ids[i : i + 1]) for i in (0, 4)])
    assert np.abs(one_by_one.astype(int) - patches[[0, 4]].astype(int)).max() <= 1  # padding does not leak


def test_audio_conditions_the_patch(engine, avatar) -> None:
    feats = np.random.default_rng(3).normal(0, 1, (2, engine.feature_dim)).astype(np.float32)
    a, b = engine.render(avatar, feats, np.array([5, 5]))
    assert np.abs(a.astype(int) - b.astype(int)).max() > 0
    as_tokens = engine.render(avatar, feats.reshape(2, 50, 64), np.array([5, 5]))  # [B, 50, D] accepted too
    np.testing.assert_array_equal(as_tokens, np.stack([a, b]))


def test_frozen_time_embedding_matches_the_unet_at_t0(engine) -> None:
    gen = engine.generator
    latents = torch.randn(4, 8, 32, 32)
    audio = torch.randn(4, 50, 64)
    frozen = gen.predict(latents, audio)
    unet = gen.unet
    unfreeze_time(unet)
    try:
        with torch.inference_mode():
            direct = unet(latents, torch.tensor([0]), encoder_hidden_states=audio + gen.pe).sample
    finally:
        from lipstream.engines.musetalk.generator import freeze_time

        freeze_time(unet, gen.timestep)
    torch.testing.assert_close(frozen, direct, atol=1e-5, rtol=1e-4)


def test_decode_follows_upstream_scaling(engine) -> None:
    gen = engine.generator
    latents = torch.randn(2, 4, 32, 32)
    with torch.inference_mode():
        x = gen.vae.decode(latents / 0.18215).sample
    expected = ((x / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8).permute(0, 2, 3, 1)
    torch.testing.assert_close(gen.decode(latents), expected, atol=1, rtol=0)


def test_missing_latents_without_auto_prepare(tiny_models: Path, small_avatar, tmp_path: Path) -> None:
    bundle = load_avatar(shutil.copytree(small_avatar.path, tmp_path / "fresh"))
    strict = create_engine("musetalk", models_dir=tiny_models, auto_prepare=False, **ENGINE_OPTS)
    feats = np.zeros((1, strict.feature_dim), np.float32)
    with pytest.raises(AvatarError, match="has no MuseTalk latents.*lipstream models latents"):
        strict.render(bundle, feats, np.array([0]))
    with pytest.raises(LipstreamError, match=r"features \[B, 3200\]"):
        strict.render(bundle, np.zeros((1, 10)), np.array([0]))


@pytest.mark.slow
def test_render_cli_end_to_end(tiny_models: Path, engine, avatar, tmp_path: Path, capsys) -> None:
    from lipstream.cli import main

    engine.prepare(avatar)  # reuse this module's latents: the CLI run checks them, not re-encodes them
    bundle_dir = shutil.copytree(avatar.path, tmp_path / "presenter")
    out, report = tmp_path / "out.mp4", tmp_path / "report.json"
    argv = [
        "render",
        "--avatar",
        str(bundle_dir),
        "--text",
        "Hello there.",
        "--voice",
        "espeak",
        "-o",
        str(out),
    ]
    argv += [
        "--report",
        str(report),
        "--no-progress",
        "--engine",
        "musetalk",
        "--models-dir",
        str(tiny_models),
    ]
    argv += ["--device", "cpu", "--dtype", "float32", "--batch-size", "4"]
    assert main(argv) == 0, capsys.readouterr().err
    data = json.loads(report.read_text())
    assert data["engine"] == "musetalk"
    with av.open(str(out)) as container:
        video = container.streams.video[0]
        assert container.streams.audio, "the MP4 carries the speech"
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video)]
    assert len(frames) == data["frames"] > 10
    assert frames[0].shape == (640, 360, 3)


def test_first_use_prepares_latents_and_says_so(engine, small_avatar, tmp_path: Path, caplog) -> None:
    bundle = load_avatar(shutil.copytree(small_avatar.path, tmp_path / "new"))
    feats = np.zeros((1, engine.feature_dim), np.float32)
    with caplog.at_level("WARNING", logger="lipstream.engines.musetalk.engine"):
        patch = engine.render(bundle, feats, np.array([0]))
    assert patch.shape == (1, 256, 256, 3)
    assert "has no MuseTalk latents yet: encoding them now" in caplog.text
    assert (bundle.engine_dir("musetalk") / LATENTS_FILE).is_file()


def test_models_latents_command(tiny_models: Path, small_avatar, tmp_path: Path, capsys) -> None:
    from lipstream.cli import main

    folder = shutil.copytree(small_avatar.path, tmp_path / "cli")
    argv = ["models", "latents", str(folder), "--models-dir", str(tiny_models), "--device", "cpu"]
    assert main(argv) == 0
    assert f"MuseTalk latents [{small_avatar.frame_count}, 8, 32, 32] stored in" in capsys.readouterr().out
    assert load_avatar(folder).manifest.engines["musetalk"]["dtype"] == "float16"
    assert (
        main(["models", "latents", str(folder), "--models-dir", str(tmp_path / "none"), "--device", "cpu"])
        == 2
    )
    assert "lipstream models download" in capsys.readouterr().err

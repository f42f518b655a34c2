"""MuseTalk loader: full-size topology on the meta device, tiny weights in the upstream layout, bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from lipstream.engines.musetalk.layout import RECORD_FILE, ModelPaths
from lipstream.engines.musetalk.loader import check_state_matches, load_models, resolve_runtime
from lipstream.engines.musetalk.topology import (
    FULL_UNET_CONFIG,
    FULL_UNET_PARAMS,
    count_params,
    unet_from_config,
)
from lipstream.errors import ModelError

CPU32 = resolve_runtime("cpu", "fp32")


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny random MuseTalk v1.5 + v1.0 weights in the upstream layout and formats."""
    from lipstream.engines.musetalk.topology import write_model_folder

    return write_model_folder(tmp_path_factory.mktemp("models"))


@pytest.fixture
def models_copy(tiny_models: Path, tmp_path: Path) -> Path:
    """A private copy to damage."""
    return Path(shutil.copytree(tiny_models, tmp_path / "models"))


def test_full_size_config_on_meta_device() -> None:
    unet = unet_from_config(FULL_UNET_CONFIG, device="meta")
    assert count_params(unet) == FULL_UNET_PARAMS == 849_947_844
    state = unet.state_dict()
    shapes = {k: tuple(v.shape) for k, v in state.items()}
    assert shapes["conv_in.weight"] == (320, 8, 3, 3)
    assert shapes["conv_out.weight"] == (4, 320, 3, 3)
    assert shapes["down_blocks.0.attentions.0.transformer_blocks.0.attn2.to_k.weight"] == (320, 384)
    assert shapes["mid_block.attentions.0.transformer_blocks.0.attn2.to_v.weight"] == (1280, 384)
    assert shapes["time_embedding.linear_1.weight"] == (1280, 320)
    assert all(not k.startswith("down_blocks.3.attentions") for k in state)  # DownBlock2D: no attention
    assert all(p.is_meta for p in unet.parameters())
    check_state_matches(unet, state, Path("unet.pth"), Path("musetalk.json"))  # the loader's own check
    renamed = {("model." + k if k == "conv_in.weight" else k): v for k, v in state.items()}
    with pytest.raises(ModelError, match="1 keys missing .*conv_in.weight.*1 unexpected"):
        check_state_matches(unet, renamed, Path("unet.pth"), Path("musetalk.json"))


@pytest.mark.parametrize("version", ["1.5", "1.0"])
def test_tiny_models_load_from_upstream_layout(tiny_models: Path, version: str) -> None:
    models = load_models(tiny_models, version, CPU32)
    assert models.unet.config.block_out_channels == [
        16,
        32,
        32,
        32,
    ]  # read from musetalk.json, not hard-coded
    assert models.unet.config.cross_attention_dim == models.audio_dim == 64
    assert models.audio_states == 5
    assert models.scaling_factor == pytest.approx(0.18215)
    assert all(not t.is_meta for t in [*models.unet.parameters(), *models.unet.buffers()])
    folder = "musetalkV15" if version == "1.5" else "musetalk"
    assert models.paths.unet_weights.parent.name == folder
    saved = torch.load(models.paths.unet_weights, weights_only=True)
    loaded = {k: v for k, v in models.unet.state_dict().items() if not k.startswith("time_embedding")}
    for key in ("conv_in.weight", "mid_block.attentions.0.proj_in.weight"):
        torch.testing.assert_close(loaded[key], saved[key])


def test_missing_unet_names_file_and_command(models_copy: Path) -> None:
    (models_copy / "musetalkV15" / "unet.pth").unlink()
    with pytest.raises(ModelError, match=r"musetalkV15/unet.pth not found.*lipstream models download"):
        load_models(models_copy, "1.5", CPU32)


def test_missing_whisper_folder(models_copy: Path) -> None:
    shutil.rmtree(models_copy / "whisper")
    with pytest.raises(ModelError, match=r"whisper/config.json not found.*lipstream models download"):
        load_models(models_copy, "1.5", CPU32)


def test_truncated_unet_is_named_with_sizes(models_copy: Path) -> None:
    path = models_copy / "musetalkV15" / "unet.pth"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 10])  # below what the config's parameters need
    with pytest.raises(ModelError, match=r"unet.pth is [\d,]+ bytes.*needs at least [\d,]+.*truncated"):
        load_models(models_copy, "1.5", CPU32)
    path.write_bytes(data[: int(len(data) * 0.9)])  # big enough, but the zip is cut
    with pytest.raises(ModelError, match=r"unet.pth \([\d,]+ bytes\) is not a readable torch state dict"):
        load_models(models_copy, "1.5", CPU32)


def test_size_recorded_by_download_is_checked(models_copy: Path) -> None:
    rel = "sd-vae/diffusion_pytorch_model.bin"
    real = (models_copy / rel).stat().st_size
    record = {"files": {rel: {"size": real + 1000, "sha256": "ab" * 32}}}
    (models_copy / RECORD_FILE).write_text(json.dumps(record))
    with pytest.raises(
        ModelError, match=rf"{real:,} bytes but {real + 1000:,} were downloaded \(sha256 abab"
    ):
        load_models(models_copy, "1.5", CPU32)


def test_config_that_does_not_match_weights(models_copy: Path) -> None:
    config_path = models_copy / "musetalkV15" / "musetalk.json"
    config = json.loads(config_path.read_text())
    config["block_out_channels"] = [16, 32, 32, 64]
    config_path.write_text(json.dumps(config))
    with pytest.raises(ModelError, match=r"do not match the config .*musetalk.json: .*shapes differ"):
        load_models(models_copy, "1.5", CPU32)


def test_whisper_width_must_match_unet(models_copy: Path) -> None:
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    # a valid 32-wide Whisper next to a UNet that cross-attends to 64-wide tokens
    config = json.loads((models_copy / "whisper" / "config.json").read_text())
    config.update(d_model=32, encoder_attention_heads=2, decoder_attention_heads=2)
    whisper = WhisperForConditionalGeneration(WhisperConfig(**config))
    whisper.config.save_pretrained(models_copy / "whisper")
    torch.save(whisper.state_dict(), models_copy / "whisper" / "pytorch_model.bin")
    with pytest.raises(
        ModelError, match="cross-attends to 64-d audio tokens but the Whisper .* has d_model 32"
    ):
        load_models(models_copy, "1.5", CPU32)
    (models_copy / "whisper" / "pytorch_model.bin").write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(ModelError, match="Whisper in .* failed to load"):
        load_models(models_copy, "1.5", CPU32)


def test_corrupt_config_json(models_copy: Path) -> None:
    (models_copy / "musetalkV15" / "musetalk.json").write_text("{not json")
    with pytest.raises(ModelError, match="musetalk.json is not valid JSON"):
        load_models(models_copy, "1.5", CPU32)


def test_runtime_choices() -> None:
    assert resolve_runtime("cpu", "auto").dtype == torch.float32
    assert resolve_runtime("cpu", "bfloat16").dtype == torch.bfloat16
    with pytest.raises(ModelError, match="fp16 on CPU"):
        resolve_runtime("cpu", "float16")
    with pytest.raises(ModelError, match="unknown dtype"):
        resolve_runtime("cpu", "int8")
    with pytest.raises(ModelError, match="unknown MuseTalk version"):
        ModelPaths.resolve(Path("."), "2.0")
    if not torch.cuda.is_available():
        with pytest.raises(ModelError, match="--device cuda was requested but .* sees no CUDA GPU"):
            resolve_runtime("cuda", "auto")

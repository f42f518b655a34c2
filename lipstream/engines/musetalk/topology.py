"""MuseTalk's network topologies: the UNet built from musetalk.json, and small same-topology models.

Imports only torch, diffusers and transformers (no cv2/av), so GPU benchmarks can use it on a bare machine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from lipstream.engines.musetalk.layout import UNET_FILES, VAE_DIR, WHISPER_DIR
from lipstream.errors import ModelError

# musetalk.json as published (reference/musetalk.md §1.1); used to write test and benchmark models only —
# the loader always reads the file from the models folder.
FULL_UNET_CONFIG: dict[str, Any] = {
    "_class_name": "UNet2DConditionModel",
    "_diffusers_version": "0.6.0.dev0",
    "act_fn": "silu",
    "attention_head_dim": 8,
    "block_out_channels": [320, 640, 1280, 1280],
    "center_input_sample": False,
    "cross_attention_dim": 384,
    "down_block_types": [
        "CrossAttnDownBlock2D",
        "CrossAttnDownBlock2D",
        "CrossAttnDownBlock2D",
        "DownBlock2D",
    ],
    "downsample_padding": 1,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "in_channels": 8,
    "layers_per_block": 2,
    "mid_block_scale_factor": 1,
    "norm_eps": 1e-05,
    "norm_num_groups": 32,
    "out_channels": 4,
    "sample_size": 64,
    "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"],
}
FULL_UNET_PARAMS = 849_947_844  # reference/musetalk.md §1.1

# sd-vae-ft-mse's config.json (no scaling_factor key: diffusers' default 0.18215 applies)
FULL_VAE_CONFIG: dict[str, Any] = {
    "_class_name": "AutoencoderKL",
    "act_fn": "silu",
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "in_channels": 3,
    "latent_channels": 4,
    "layers_per_block": 2,
    "norm_num_groups": 32,
    "out_channels": 3,
    "sample_size": 256,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
}

# whisper-tiny's encoder shape (the decoder is loaded but never run)
FULL_WHISPER_CONFIG: dict[str, Any] = {
    "d_model": 384,
    "encoder_layers": 4,
    "decoder_layers": 4,
    "encoder_attention_heads": 6,
    "decoder_attention_heads": 6,
    "encoder_ffn_dim": 1536,
    "decoder_ffn_dim": 1536,
    "num_mel_bins": 80,
    "max_source_positions": 1500,
}

# Same block types and depths that matter (4 VAE levels -> 32x32 latents; 4 Whisper layers -> 5 states),
# at widths small enough for CI.
TINY_UNET_OVERRIDES: dict[str, Any] = {
    "block_out_channels": [16, 32, 32, 32],
    "layers_per_block": 1,
    "norm_num_groups": 8,
    "cross_attention_dim": 64,
}
TINY_VAE_OVERRIDES: dict[str, Any] = {
    "block_out_channels": [16, 16, 32, 32],
    "layers_per_block": 1,
    "norm_num_groups": 8,
}
TINY_WHISPER_OVERRIDES: dict[str, Any] = {
    "d_model": 64,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "decoder_layers": 1,
}


def read_json(path: Path, what: str) -> dict[str, Any]:
    """Read a JSON config, turning a missing or malformed file into a ModelError."""
    from lipstream.engines.musetalk.layout import DOWNLOAD_COMMAND

    if not path.is_file():
        raise ModelError(f"{what} not found: {path} is missing; fetch the weights with `{DOWNLOAD_COMMAND}`")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{what} {path} is not valid JSON ({exc}); re-run `{DOWNLOAD_COMMAND}`") from exc
    if not isinstance(data, dict):
        raise ModelError(f"{what} {path} must hold a JSON object; re-run `{DOWNLOAD_COMMAND}`")
    return data


def unet_from_config(config: dict[str, Any], device: str | torch.device = "meta"):
    """Build a UNet2DConditionModel from a musetalk.json dict, on `device` (meta: no memory spent)."""
    from diffusers import UNet2DConditionModel

    clean = {k: v for k, v in config.items() if not k.startswith("_")}
    try:
        with torch.device(device):
            return UNet2DConditionModel.from_config(clean)
    except (TypeError, ValueError) as exc:
        raise ModelError(f"musetalk.json describes no valid UNet2DConditionModel: {exc}") from exc


def count_params(module: torch.nn.Module) -> int:
    """Number of parameters (works on the meta device)."""
    return sum(p.numel() for p in module.parameters())


def _with(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    return {**base, **overrides}


def write_model_folder(
    models_dir: Path,
    versions: tuple[str, ...] = ("1.5", "1.0"),
    tiny: bool = True,
    seed: int = 0,
) -> Path:
    """Write random-weight MuseTalk models in the upstream layout and file formats; return models_dir.

    unet.pth / pytorch_model.bin are plain torch.save state dicts, sd-vae/ a diffusers folder with a .bin,
    whisper/ a transformers folder with a .bin and preprocessor_config.json — what the loader reads.
    """
    from diffusers import AutoencoderKL
    from transformers import WhisperConfig, WhisperFeatureExtractor, WhisperForConditionalGeneration

    torch.manual_seed(seed)
    models_dir = Path(models_dir)
    unet_cfg = _with(FULL_UNET_CONFIG, TINY_UNET_OVERRIDES) if tiny else dict(FULL_UNET_CONFIG)
    vae_cfg = _with(FULL_VAE_CONFIG, TINY_VAE_OVERRIDES) if tiny else dict(FULL_VAE_CONFIG)
    whisper_cfg = _with(FULL_WHISPER_CONFIG, TINY_WHISPER_OVERRIDES) if tiny else dict(FULL_WHISPER_CONFIG)

    for version in versions:
        files = UNET_FILES[version]
        folder = models_dir / files.folder
        folder.mkdir(parents=True, exist_ok=True)
        (folder / files.config).write_text(json.dumps(unet_cfg, indent=2) + "\n")
        unet = unet_from_config(unet_cfg, device="cpu")
        torch.save(unet.state_dict(), folder / files.weights)

    vae = AutoencoderKL.from_config({k: v for k, v in vae_cfg.items() if not k.startswith("_")})
    vae_dir = models_dir / VAE_DIR
    vae_dir.mkdir(parents=True, exist_ok=True)
    vae.save_config(vae_dir)
    torch.save(vae.state_dict(), vae_dir / "diffusion_pytorch_model.bin")

    # the hub checkpoint is the full seq2seq model (keys "model.encoder.*"), so write that
    whisper = WhisperForConditionalGeneration(WhisperConfig(**whisper_cfg))
    whisper_dir = models_dir / WHISPER_DIR
    whisper_dir.mkdir(parents=True, exist_ok=True)
    whisper.config.save_pretrained(whisper_dir)
    state = {
        k: v for k, v in whisper.state_dict().items() if k != "proj_out.weight"
    }  # tied, as the hub saves it
    torch.save(state, whisper_dir / "pytorch_model.bin")
    WhisperFeatureExtractor(feature_size=whisper_cfg["num_mel_bins"]).save_pretrained(whisper_dir)
    return models_dir


def random_models(
    tiny: bool = False, device: str | torch.device = "cpu", seed: int = 0
) -> tuple[Any, Any, Any, Any]:
    """(unet, vae, whisper encoder, feature extractor) with random weights, fp32, built directly on `device`.

    For benchmarks: the topology of the published weights (or the tiny CI widths); nothing read from disk.
    """
    from diffusers import AutoencoderKL
    from transformers import WhisperConfig, WhisperFeatureExtractor
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    torch.manual_seed(seed)
    unet_cfg = _with(FULL_UNET_CONFIG, TINY_UNET_OVERRIDES) if tiny else dict(FULL_UNET_CONFIG)
    vae_cfg = _with(FULL_VAE_CONFIG, TINY_VAE_OVERRIDES) if tiny else dict(FULL_VAE_CONFIG)
    whisper_cfg = _with(FULL_WHISPER_CONFIG, TINY_WHISPER_OVERRIDES) if tiny else dict(FULL_WHISPER_CONFIG)
    with torch.device(device):
        unet = unet_from_config(unet_cfg, device=device)
        vae = AutoencoderKL.from_config({k: v for k, v in vae_cfg.items() if not k.startswith("_")})
        encoder = WhisperEncoder(WhisperConfig(**whisper_cfg))
    extractor = WhisperFeatureExtractor(feature_size=whisper_cfg["num_mel_bins"])
    return (
        unet.eval().requires_grad_(False),
        vae.eval().requires_grad_(False),
        encoder.eval().requires_grad_(False),
        extractor,
    )

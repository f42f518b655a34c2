"""The three torch modules that become MuseTalk's browser graphs, each a fixed-shape pure function.

Each wraps the Python engine's own code path (generator.py, features.py), so the graphs compute exactly
what the server computes:
- unet: [B,8,32,32] latents + [B,50,384] windowed audio features -> [B,4,32,32]; timestep 0 and the
  positional encoding of the audio tokens are baked in (the caller feeds the raw windows).
- vae_decoder: [B,4,32,32] -> [B,3,256,256] RGB, already scaled, clamped and rounded to 0..255.
- whisper_encoder: one 30 s log-mel segment [1,80,3000] -> stacked states [1,1500,S,384]. The per-frame
  windowing stays outside the graph: it depends on the utterance's real length (steps past it read as 0)
  and on streaming, which a fixed shape cannot know; it is a gather of rows (features.frame_windows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lipstream.engines.musetalk.features import WINDOW_STEPS, stacked_states
from lipstream.engines.musetalk.generator import PATCH_SIZE, freeze_time, positional_encoding

MEL_FRAMES = 3000  # one 30 s Whisper segment at 100 Hz, as the feature extractor pads it


class UNetGraph(nn.Module):
    """MuseTalk's single UNet pass at t=0, with the audio tokens' positional encoding added inside."""

    def __init__(self, unet: Any, tokens: int) -> None:
        super().__init__()
        freeze_time(unet, torch.zeros(1, dtype=torch.long))  # the t=0 time MLP becomes a constant
        self.unet = unet
        self.register_buffer("timestep", torch.zeros(1, dtype=torch.long), persistent=False)
        dim = int(unet.config.cross_attention_dim)
        self.register_buffer("pe", positional_encoding(tokens, dim), persistent=False)

    def forward(self, latents: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        """[B,8,32,32] masked|reference latents + [B,T,D] audio windows -> [B,4,32,32] predicted latents."""
        return self.unet(latents, self.timestep, encoder_hidden_states=audio + self.pe, return_dict=False)[0]


class DecoderGraph(nn.Module):
    """The VAE decoder with MuseTalk's scaling and upstream's [-1,1] -> 0..255 rounding."""

    def __init__(self, vae: Any) -> None:
        super().__init__()
        self.vae = vae
        self.scaling = float(vae.config.scaling_factor)

    def forward(self, latents: torch.Tensor) -> torch.Tensor:
        """[B,4,32,32] -> [B,3,256,256] RGB values 0..255 (integers held as floats)."""
        image = self.vae.decode(latents / self.scaling, return_dict=False)[0]
        return torch.round((image / 2 + 0.5).clamp(0, 1) * 255)


class WhisperGraph(nn.Module):
    """Whisper's encoder over one padded 30 s segment, every state stacked as the engine stacks them."""

    def __init__(self, encoder: Any, pre_norm_last: bool) -> None:
        super().__init__()
        self.encoder = encoder
        self.pre_norm_last = pre_norm_last

    def forward(self, mel: torch.Tensor) -> torch.Tensor:
        """[1,80,3000] log-mel -> [1,1500,S,D] states (S = layers + 1)."""
        return stacked_states(self.encoder, mel, self.pre_norm_last)


@dataclass(frozen=True)
class GraphSpec:
    """One exported graph: file stem, its module, example inputs and the names of its tensors."""

    name: str
    module: nn.Module
    inputs: tuple[torch.Tensor, ...]
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    half: bool  # converted to float16 when the export asks for it (Whisper stays fp32: see onnx_export)


def graph_specs(models: Any, batch: int, pre_norm_last: bool) -> list[GraphSpec]:
    """The unet, vae_decoder and whisper_encoder specs for fp32 models (CPU), at a fixed batch."""
    latent_ch = int(models.vae.config.latent_channels)
    side = PATCH_SIZE // 2 ** (len(models.vae.config.block_out_channels) - 1)
    tokens, dim = WINDOW_STEPS * models.audio_states, models.audio_dim
    mels = int(models.whisper.config.num_mel_bins)
    return [
        GraphSpec(
            "unet",
            UNetGraph(models.unet, tokens),
            (torch.zeros(batch, 2 * latent_ch, side, side), torch.zeros(batch, tokens, dim)),
            ("latents", "audio"),
            ("pred_latents",),
            half=True,
        ),
        GraphSpec(
            "vae_decoder",
            DecoderGraph(models.vae),
            (torch.zeros(batch, latent_ch, side, side),),
            ("latents",),
            ("rgb",),
            half=True,
        ),
        GraphSpec(
            "whisper_encoder",
            WhisperGraph(models.whisper, pre_norm_last),
            (torch.zeros(1, mels, MEL_FRAMES),),
            ("mel",),
            ("states",),
            half=False,
        ),
    ]

"""The per-frame neural step: UNet at t=0 on [masked | reference] latents + audio tokens, then VAE decode.

Fixed batch shapes (the caller's last batch is padded by repeating its last item), one warm-up batch at
construction, inference_mode, and the constant t=0 time embedding computed once. No cv2/av imports.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from lipstream.engines.musetalk.loader import Runtime

PATCH_SIZE = 256  # MuseTalk's face crop and output size


class FrozenTimeEmbedding(nn.Module):
    """Stands in for the UNet's time MLP: MuseTalk always runs at t=0, so its output is a constant."""

    def __init__(self, original: nn.Module, value: torch.Tensor) -> None:
        super().__init__()
        self.original = original  # kept so unfreeze_time() can put it back
        self.register_buffer("value", value, persistent=False)

    def forward(self, sample: torch.Tensor, condition: torch.Tensor | None = None) -> torch.Tensor:
        """The cached embedding, broadcast to the batch."""
        return self.value.expand(sample.shape[0], -1)


def freeze_time(unet: Any, timestep: torch.Tensor) -> None:
    """Replace unet.time_embedding by its constant output at `timestep` (computed once, here)."""
    if isinstance(unet.time_embedding, FrozenTimeEmbedding):
        return
    with torch.inference_mode():
        t_emb = unet.time_proj(timestep.reshape(1)).to(dtype=unet.dtype)
        value = unet.time_embedding(t_emb).clone()
    unet.time_embedding = FrozenTimeEmbedding(unet.time_embedding, value)


def unfreeze_time(unet: Any) -> None:
    """Put the UNet's own time MLP back (for side-by-side benchmarks)."""
    if isinstance(unet.time_embedding, FrozenTimeEmbedding):
        unet.time_embedding = unet.time_embedding.original


def positional_encoding(n_tokens: int, dim: int) -> torch.Tensor:
    """Upstream's sinusoid added to the audio tokens: pe[p, 2i] = sin(p / 10000^(2i/d)), pe[p, 2i+1] = cos."""
    position = torch.arange(n_tokens, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    pe = torch.zeros(n_tokens, dim)
    pe[:, 0::2] = torch.sin(position * div)
    pe[:, 1::2] = torch.cos(position * div)
    return pe


class MuseTalkGenerator:
    """UNet + VAE decoder at one fixed batch size; latents and audio in, uint8 RGB 256x256 patches out."""

    def __init__(
        self,
        unet: Any,
        vae: Any,
        runtime: Runtime,
        audio_tokens: int,
        batch_size: int = 8,
        compile: bool = False,
        channels_last: bool = False,
        frozen_time: bool = True,
        warmup: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError("batch_size must be >= 1")
        self.unet, self.vae, self.runtime = unet, vae, runtime
        self.batch_size = batch_size
        self.audio_tokens = audio_tokens
        self.scaling = float(vae.config.scaling_factor)
        dev, dt = runtime.device, runtime.dtype
        self.timestep = torch.zeros(1, dtype=torch.long, device=dev)
        self.pe = positional_encoding(audio_tokens, int(unet.config.cross_attention_dim)).to(dev, dt)
        if frozen_time:
            freeze_time(unet, self.timestep)
        else:
            unfreeze_time(unet)
        if channels_last:
            unet.to(memory_format=torch.channels_last)
            vae.to(memory_format=torch.channels_last)
        # dynamic=False: one static graph per fixed batch shape, never a symbolic one
        self._unet_call = torch.compile(unet, dynamic=False) if compile else unet
        self._decode_call = torch.compile(vae.decode, dynamic=False) if compile else vae.decode
        side = PATCH_SIZE // 2 ** (len(vae.config.block_out_channels) - 1)  # 32 for sd-vae's x8 downsampling
        self.latent_shape = (2 * int(vae.config.latent_channels), side, side)
        if warmup:
            self.warmup()

    def warmup(self) -> None:
        """Run one dummy batch of the fixed shape, so no shape is first seen (or compiled) when live."""
        dev, dt = self.runtime.device, self.runtime.dtype
        latents = torch.zeros((self.batch_size, *self.latent_shape), device=dev, dtype=dt)
        audio = torch.zeros((self.batch_size, self.audio_tokens, self.pe.shape[1]), device=dev, dtype=dt)
        self.run(latents, audio)

    def predict(self, latents: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        """UNet at t=0: [B, 8, 32, 32] model-dtype latents + [B, tokens, D] audio -> [B, 4, 32, 32]."""
        with torch.inference_mode():
            return self._unet_call(
                latents, self.timestep, encoder_hidden_states=audio + self.pe, return_dict=False
            )[0]

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """VAE decode to uint8 [B, 256, 256, 3] RGB on the device (upstream's scaling and rounding)."""
        with torch.inference_mode():
            image = self._decode_call(latents / self.scaling, return_dict=False)[0]
            image = (image.float() / 2 + 0.5).clamp(0, 1).mul(255).round().to(torch.uint8)
            return image.permute(0, 2, 3, 1)

    def run(self, latents: torch.Tensor, audio: torch.Tensor) -> np.ndarray:
        """Patches for B <= batch_size items; a short batch is padded by repeating its last item."""
        n = latents.shape[0]
        if n == 0:
            return np.zeros((0, PATCH_SIZE, PATCH_SIZE, 3), np.uint8)
        if n > self.batch_size:
            raise ValueError(f"batch of {n} exceeds the fixed batch size {self.batch_size}")
        if n < self.batch_size:
            pad = self.batch_size - n
            latents = torch.cat([latents, latents[-1:].expand(pad, *latents.shape[1:])])
            audio = torch.cat([audio, audio[-1:].expand(pad, *audio.shape[1:])])
        return self.decode(self.predict(latents, audio))[:n].cpu().numpy()

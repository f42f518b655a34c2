"""MuseTalkEngine: the Engine protocol over Whisper features, cached avatar latents and the UNet/VAE step."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from lipstream.avatar.bundle import AvatarBundle
from lipstream.engines.base import Engine, FeatureStream, Speech
from lipstream.engines.musetalk.features import (
    LOOKAHEAD_FRAMES,
    WINDOW_STEPS,
    WhisperFeaturizer,
    last_state_pre_norm,
)
from lipstream.engines.musetalk.generator import PATCH_SIZE, MuseTalkGenerator
from lipstream.engines.musetalk.latents import (
    ENGINE,
    JAW_MARGIN_PX,
    bundle_margins,
    cached_latents,
    frame_rows,
    prepare_latents,
    to_bundle_crop,
    vae_fingerprint,
)
from lipstream.engines.musetalk.loader import load_models, resolve_runtime
from lipstream.errors import AvatarError, LipstreamError
from lipstream.paths import models_dir as default_models_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MuseTalkOptions:
    """How to build the engine (from --models-dir, --musetalk-version, --device, --dtype, --batch-size)."""

    models_dir: Path
    version: str = "1.5"
    device: str = "auto"
    dtype: str = "auto"
    batch_size: int = 8
    compile: bool = False
    auto_prepare: bool = True  # encode missing avatar latents on first use (else: error saying how)


class MuseTalkEngine(Engine):
    """Neural lip-sync: features [T, 10*5*384] (time-major window of 5 stacked Whisper states per step),
    patches uint8 RGB [B, 256, 256, 3] in crop space."""

    name = "musetalk"
    feature_kind = "whisper"
    accelerate_by_default = True  # a neural pass per frame is the cost acceleration exists to avoid
    patch_size = PATCH_SIZE
    lookahead_frames = LOOKAHEAD_FRAMES

    def __init__(
        self,
        models_dir: str | os.PathLike | None = None,
        version: str = "1.5",
        device: str = "auto",
        dtype: str = "auto",
        batch_size: int = 8,
        compile: bool = False,
        auto_prepare: bool = True,
    ) -> None:
        if int(batch_size) < 1:
            raise LipstreamError(f"--batch-size must be at least 1 (got {batch_size})")
        self.options = MuseTalkOptions(
            Path(default_models_dir(models_dir)),
            str(version),
            device,
            dtype,
            int(batch_size),
            compile,
            auto_prepare,
        )
        runtime = resolve_runtime(device, dtype)
        self.models = load_models(self.options.models_dir, self.options.version, runtime)
        self.featurizer = WhisperFeaturizer(
            self.models.whisper, self.models.feature_extractor, last_state_pre_norm(self.options.version)
        )
        self.featurizer.encode_segment(np.zeros(runtime_warmup_samples(), np.float32))  # warm-up
        self.generator = MuseTalkGenerator(
            self.models.unet,
            self.models.vae,
            runtime,
            audio_tokens=WINDOW_STEPS * self.featurizer.n_states,
            batch_size=self.options.batch_size,
            compile=compile,
        )
        self._vae_id = vae_fingerprint(self.models.vae)
        self._latents: dict[str, tuple[torch.Tensor, np.ndarray]] = {}  # bundle path -> latents, frame rows
        # sessions on several threads may ask for an avatar's latents at once: encoded once
        self._latents_lock = threading.RLock()
        self._generators: dict[int, MuseTalkGenerator] = {}  # more fixed batch sizes (cross-session batching)

    @property
    def batch_size(self) -> int:
        """The fixed batch the UNet and VAE always run at."""
        return self.options.batch_size

    @property
    def feature_dim(self) -> int:
        """Values per frame: 10 steps x 5 states x 384 = 19200 for whisper-tiny."""
        return self.featurizer.feature_dim

    def prepare(self, bundle: AvatarBundle) -> None:
        """Encode and store the avatar's masked/reference crop latents (once; idempotent)."""
        prepare_latents(bundle, self.models.vae, version=self.options.version)

    def features(self, speech: Speech) -> np.ndarray:
        """Per-frame Whisper windows [speech.frame_count, feature_dim] for a whole utterance."""
        return self.featurizer.features(speech.pcm)

    def stream_features(self) -> FeatureStream:
        """Incremental features that re-encode at most the current 30 s segment per push."""
        return self.featurizer.stream()

    def _bundle_latents(self, bundle: AvatarBundle) -> tuple[torch.Tensor, np.ndarray]:
        """The avatar's latents on the device, and each frame's row in them (-1: not encoded)."""
        key = str(Path(bundle.path).resolve())
        with self._latents_lock:
            return self._latents.get(key) or self._load_latents(bundle, key)

    def _load_latents(self, bundle: AvatarBundle, key: str) -> tuple[torch.Tensor, np.ndarray]:
        latents = cached_latents(bundle, self._vae_id, self.options.version)
        if latents is None:
            if not self.options.auto_prepare:
                raise AvatarError(
                    f"avatar '{bundle.name}' has no MuseTalk latents for this VAE; prepare them with "
                    f"`lipstream models latents {bundle.name}` (or render once with auto-prepare)"
                )
            log.warning("avatar '%s' has no MuseTalk latents yet: encoding them now, once", bundle.name)
            latents = prepare_latents(bundle, self.models.vae, version=self.options.version)
        rt = self.models.runtime
        tensor = torch.from_numpy(np.array(latents, dtype=np.float16)).to(device=rt.device, dtype=rt.dtype)
        self._latents[key] = (tensor, frame_rows(bundle))
        return self._latents[key]

    def render(self, bundle: AvatarBundle, features: np.ndarray, frame_ids: np.ndarray) -> np.ndarray:
        """Mouth patches uint8 RGB [B, 256, 256, 3] for features [B, feature_dim] on source frames ids."""
        latents, audio = self.pass_inputs(bundle, features, frame_ids)
        out = np.empty((len(latents), PATCH_SIZE, PATCH_SIZE, 3), np.uint8)
        step = self.batch_size
        for start in range(0, len(latents), step):
            chunk = slice(start, start + step)
            out[chunk] = self.generator.run(latents[chunk], audio[chunk])
        return self.finish_patches(bundle, frame_ids, out)

    def pass_inputs(
        self, bundle: AvatarBundle, features: np.ndarray, frame_ids: np.ndarray
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The UNet's inputs for these frames, on the device: [B, 8, 32, 32] latents, [B, tokens, D] audio
        (checked; what a cross-session batcher stacks with other sessions' inputs)."""
        frame_ids = np.asarray(frame_ids, dtype=np.int64).reshape(-1)
        features = np.asarray(features, dtype=np.float32)
        tokens, dim = WINDOW_STEPS * self.featurizer.n_states, self.featurizer.dim
        if features.ndim == 3 and features.shape[1:] == (tokens, dim):
            features = features.reshape(len(features), -1)  # [B, 50, 384] is accepted too
        if features.ndim != 2 or features.shape[1] != self.feature_dim or len(features) != len(frame_ids):
            raise LipstreamError(
                f"MuseTalk needs features [B, {self.feature_dim}], one row per frame; got {features.shape} "
                f"for {len(frame_ids)} frame ids (compute them with this engine's features())"
            )
        if len(frame_ids) and (frame_ids.min() < 0 or frame_ids.max() >= bundle.frame_count):
            raise AvatarError(f"frame ids must lie in [0, {bundle.frame_count}) for avatar '{bundle.name}'")
        latents, rows_of = self._bundle_latents(bundle)
        rows = rows_of[frame_ids]
        if len(rows) and rows.min() < 0:
            missing = int(frame_ids[np.argmin(rows)])
            raise AvatarError(
                f"frame {missing} of avatar '{bundle.name}' is not in its idle loop, so it has no latents "
                "(only the frames the idle loop shows are drawn on)"
            )
        rt = self.models.runtime
        audio = torch.from_numpy(features.reshape(-1, tokens, dim)).to(rt.device, rt.dtype)
        return latents[torch.from_numpy(rows).to(rt.device)], audio

    def finish_patches(self, bundle: AvatarBundle, frame_ids: np.ndarray, out: np.ndarray) -> np.ndarray:
        """The pass's patches as this avatar's crops (v1.0's cover the box without the jaw margin)."""
        if JAW_MARGIN_PX.get(self.options.version, 0):
            out = np.array(out)
            margins = bundle_margins(bundle)
            for i, frame_id in enumerate(np.asarray(frame_ids).reshape(-1)):
                frame = np.asarray(bundle.frames[frame_id])
                box, margin = bundle.boxes[frame_id], margins[frame_id]
                out[i] = to_bundle_crop(out[i], frame, box, self.options.version, margin)
        return out

    def pass_runner(self, size: int) -> Callable[[torch.Tensor, torch.Tensor], np.ndarray]:
        """The UNet + VAE at one fixed batch `size` (built, compiled if asked, and warmed on first use; one
        per size, sharing the weights): what a cross-session batcher runs."""
        with self._latents_lock:
            if size == self.batch_size:
                return self.generator.run
            if size not in self._generators:
                self._generators[size] = MuseTalkGenerator(
                    self.models.unet, self.models.vae, self.models.runtime,
                    audio_tokens=WINDOW_STEPS * self.featurizer.n_states, batch_size=size,
                    compile=self.options.compile,
                )  # fmt: skip
            return self._generators[size].run

    @staticmethod
    def stack_inputs(parts: list[torch.Tensor]) -> torch.Tensor:
        """Joins several jobs' inputs into one pass (the generator pads a short pass itself)."""
        return torch.cat(list(parts))


def runtime_warmup_samples() -> int:
    """One second of silence warms Whisper up (every call pads to a full 30 s segment anyway)."""
    return 16_000


__all__ = ["MuseTalkEngine", "MuseTalkOptions", "ENGINE"]

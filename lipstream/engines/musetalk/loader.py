"""Load MuseTalk's UNet, VAE and Whisper from an upstream-layout models folder, with clear errors.

Configs are always read from the folder (musetalk.json, config.json), so a model of another width loads
through the same code. No cv2/av imports: the GPU benchmark uses this module on a bare machine.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lipstream.engines.musetalk.layout import DOWNLOAD_COMMAND, RECORD_FILE, ModelPaths, unet_files
from lipstream.engines.musetalk.topology import count_params, read_json, unet_from_config
from lipstream.errors import ModelError

log = logging.getLogger(__name__)

DTYPE_NAMES = {
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp32": torch.float32,
    "float32": torch.float32,
}


@dataclass(frozen=True)
class Runtime:
    """Where and in which precision the networks run."""

    device: torch.device
    dtype: torch.dtype

    @property
    def dtype_name(self) -> str:
        """Short name of the dtype (fp16, bf16, fp32)."""
        return {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[self.dtype]


def resolve_runtime(device: str = "auto", dtype: str = "auto") -> Runtime:
    """Pick device and dtype: fp16 on CUDA, fp32 on CPU by default; refuse what cannot work."""
    device = (device or "auto").lower()
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ModelError(
                f"--device {device} was requested but this torch ({torch.__version__}) sees no CUDA GPU; "
                "use --device cpu, or install a CUDA build of torch on a machine with an NVIDIA GPU"
            )
    elif device != "cpu":
        raise ModelError(f"unknown device '{device}'; use cuda, cuda:N, cpu or auto")
    name = (dtype or "auto").lower()
    if name == "auto":
        torch_dtype = torch.float16 if device.startswith("cuda") else torch.float32
    elif name in DTYPE_NAMES:
        torch_dtype = DTYPE_NAMES[name]
    else:
        raise ModelError(f"unknown dtype '{dtype}'; use fp16 (CUDA), bf16, fp32 or auto")
    if device == "cpu" and torch_dtype == torch.float16:
        # torch's CPU fp16 kernels ran the UNet ~100x slower than fp32 here (reference/python-stack.md §1)
        raise ModelError("fp16 on CPU is about 100x slower than fp32; use --dtype bf16 or fp32 on CPU")
    return Runtime(device=torch.device(device), dtype=torch_dtype)


@dataclass
class MuseTalkModels:
    """The loaded networks and what they were loaded from."""

    version: str
    paths: ModelPaths
    runtime: Runtime
    unet: Any  # diffusers UNet2DConditionModel
    vae: Any  # diffusers AutoencoderKL
    whisper: Any  # transformers WhisperEncoder
    feature_extractor: Any  # transformers WhisperFeatureExtractor

    @property
    def scaling_factor(self) -> float:
        """VAE latent scaling (0.18215 for sd-vae-ft-mse, read from its config or diffusers' default)."""
        return float(self.vae.config.scaling_factor)

    @property
    def audio_dim(self) -> int:
        """Width of one audio token (Whisper d_model; 384 for whisper-tiny)."""
        return int(self.whisper.config.d_model)

    @property
    def audio_states(self) -> int:
        """Hidden states stacked per encoder step (embedding + one per layer; 5 for whisper-tiny)."""
        return int(self.whisper.config.encoder_layers) + 1


def describe(exc: BaseException) -> str:
    """An exception as one short line: type and the start of its message."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:160]}" if text else type(exc).__name__


def _missing(path: Path, models_dir: Path) -> ModelError:
    return ModelError(
        f"MuseTalk weights missing: {path} not found; fetch them with "
        f"`{DOWNLOAD_COMMAND} --models-dir {models_dir}` (or point --models-dir at MuseTalk's models/ folder)"
    )


def _recorded_sizes(models_dir: Path) -> dict[str, dict]:
    """Sizes and hashes the download command recorded (empty for folders it did not write)."""
    record = models_dir / RECORD_FILE
    if not record.is_file():
        return {}
    try:
        return json.loads(record.read_text()).get("files", {})
    except ValueError:
        return {}


def check_files(paths: ModelPaths) -> None:
    """Every required file exists and has the size the download recorded."""
    for path in paths.required_files():
        if not path.is_file():
            raise _missing(path, paths.root)
    for folder, stem in ((paths.vae_dir, "diffusion_pytorch_model"), (paths.whisper_dir, "pytorch_model")):
        if not any((folder / f"{stem}{ext}").is_file() for ext in (".bin", ".safetensors")):
            raise _missing(folder / f"{stem}.bin", paths.root)
    for rel, info in _recorded_sizes(paths.root).items():
        path = paths.root / rel
        expected = int(info.get("size", -1))
        if path.is_file() and expected >= 0 and path.stat().st_size != expected:
            raise ModelError(
                f"{path} is {path.stat().st_size:,} bytes but {expected:,} were downloaded "
                f"(sha256 {info.get('sha256', '?')}); it is truncated or changed — re-run "
                f"`{DOWNLOAD_COMMAND} --models-dir {paths.root}`"
            )


def load_unet_state(path: Path, min_bytes: int) -> dict[str, torch.Tensor]:
    """torch.load a UNet state dict (memory-mapped when the file allows), naming the file on failure."""
    size = path.stat().st_size
    if size < min_bytes:
        raise ModelError(
            f"{path} is {size:,} bytes, but the UNet that musetalk.json describes needs at least "
            f"{min_bytes:,} (fp16) — the file is truncated; re-run `{DOWNLOAD_COMMAND}`"
        )
    try:
        try:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if "mmap" not in str(exc):
                raise
            state = torch.load(path, map_location="cpu", weights_only=True)  # legacy (non-zip) pickle
    except Exception as exc:  # noqa: BLE001 - any unpickling failure means a bad file
        raise ModelError(
            f"{path} ({size:,} bytes) is not a readable torch state dict ({describe(exc)}); "
            f"it is corrupt or truncated — re-run `{DOWNLOAD_COMMAND}`"
        ) from exc
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]  # some training checkpoints wrap the weights
    if not isinstance(state, dict):
        raise ModelError(f"{path} holds a {type(state).__name__}, not a UNet state dict")
    return state


def check_state_matches(
    unet: torch.nn.Module, state: dict[str, torch.Tensor], path: Path, config: Path
) -> None:
    """The state dict has exactly the keys and shapes that the config's UNet has."""
    expected = {k: tuple(v.shape) for k, v in unet.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = [k for k in expected if k in state and tuple(state[k].shape) != expected[k]]
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"{len(missing)} keys missing (e.g. {missing[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
        if wrong:
            k = wrong[0]
            parts.append(
                f"{len(wrong)} shapes differ (e.g. {k}: file {tuple(state[k].shape)}, config {expected[k]})"
            )
        raise ModelError(
            f"UNet weights {path} do not match the config {config}: {'; '.join(parts)}; "
            "use the musetalk.json that came with these weights"
        )


def load_unet(paths: ModelPaths, runtime: Runtime):
    """Build the UNet from musetalk.json on the meta device and assign the file's weights."""
    config = read_json(paths.unet_config, "UNet config")
    unet = unet_from_config(config, device="meta")
    min_bytes = count_params(unet) * 2
    state = load_unet_state(paths.unet_weights, min_bytes)
    check_state_matches(unet, state, paths.unet_weights, paths.unet_config)
    # cast tensor by tensor before assigning: no second full-size copy, and no dtype cast of the module
    state = {k: v.to(dtype=runtime.dtype) if v.is_floating_point() else v for k, v in state.items()}
    unet.load_state_dict(state, strict=True, assign=True)
    return unet.to(device=runtime.device).eval().requires_grad_(False)


def load_vae(paths: ModelPaths, runtime: Runtime):
    """AutoencoderKL from the sd-vae folder (diffusers format)."""
    from diffusers import AutoencoderKL

    try:
        vae = AutoencoderKL.from_pretrained(
            paths.vae_dir, local_files_only=True, torch_dtype=runtime.dtype, low_cpu_mem_usage=False
        )
    except Exception as exc:  # noqa: BLE001 - diffusers raises many types for bad folders
        raise ModelError(
            f"VAE in {paths.vae_dir} could not be loaded ({describe(exc)}); re-run `{DOWNLOAD_COMMAND}`"
        ) from exc
    return vae.to(device=runtime.device).eval().requires_grad_(False)


def load_whisper(paths: ModelPaths, runtime: Runtime):
    """Whisper encoder and its feature extractor from the whisper folder (transformers format)."""
    from transformers import WhisperFeatureExtractor, WhisperModel

    try:
        model = WhisperModel.from_pretrained(paths.whisper_dir, local_files_only=True)
        extractor = WhisperFeatureExtractor.from_pretrained(paths.whisper_dir, local_files_only=True)
    except Exception as exc:  # noqa: BLE001
        raise ModelError(
            f"Whisper in {paths.whisper_dir} failed to load ({describe(exc)}); re-run `{DOWNLOAD_COMMAND}`"
        ) from exc
    encoder = model.get_encoder()
    # CPU: fp32 (Whisper is cheap, bf16 would only cost accuracy); CUDA: the engine dtype, as upstream.
    dtype = runtime.dtype if runtime.device.type == "cuda" else torch.float32
    return encoder.to(device=runtime.device, dtype=dtype).eval().requires_grad_(False), extractor


def load_models(models_dir: Path, version: str = "1.5", runtime: Runtime | None = None) -> MuseTalkModels:
    """Load every network of one MuseTalk version from `models_dir`."""
    runtime = runtime or resolve_runtime()
    unet_files(version)  # validates the version name
    paths = ModelPaths.resolve(Path(models_dir), version)
    check_files(paths)
    whisper, extractor = load_whisper(paths, runtime)
    vae = load_vae(paths, runtime)
    unet = load_unet(paths, runtime)
    if unet.config.cross_attention_dim != whisper.config.d_model:
        raise ModelError(
            f"UNet config {paths.unet_config} cross-attends to {unet.config.cross_attention_dim}-d audio "
            f"tokens but the Whisper in {paths.whisper_dir} has d_model {whisper.config.d_model}; "
            "they do not belong together"
        )
    if (
        unet.config.in_channels != 2 * vae.config.latent_channels
        or unet.config.out_channels != vae.config.latent_channels
    ):
        raise ModelError(
            f"UNet config {paths.unet_config} (in {unet.config.in_channels}, out {unet.config.out_channels} "
            f"channels) does not fit the VAE's {vae.config.latent_channels} latent channels (in 2x, out 1x)"
        )
    log.info("loaded MuseTalk %s from %s on %s/%s", version, models_dir, runtime.device, runtime.dtype_name)
    return MuseTalkModels(version, paths, runtime, unet, vae, whisper, extractor)

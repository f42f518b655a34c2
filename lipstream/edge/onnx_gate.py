"""The export's correctness gate: onnxruntime (CPU) on the written graphs against the torch engine.

Inputs are real, not noise: face crops of the sample avatar's photograph (skimage's astronaut) encoded by
the VAE being exported, exactly as the engine caches them (fp16 posterior means), and the bundled Piper
voice speaking a sentence, run through the engine's own Whisper featurizer. Limits: fp32 graphs keep the
UNet's latents within 1e-3 (max abs); every export keeps the decoded face within 35 dB PSNR of torch fp32;
Whisper's stacked states within 1e-3 of torch, relative to their largest magnitude (at least 1).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.engines.musetalk.features import WINDOW_STEPS, WhisperFeaturizer, stacked_states
from lipstream.engines.musetalk.generator import PATCH_SIZE, MuseTalkGenerator
from lipstream.engines.musetalk.latents import encode_crops

GATE_SENTENCE = "Hello, and welcome. Every word you hear moves the lips you see."
CROP_SCALES = (1.0, 0.94, 1.06, 0.9)  # a few framings of the same face: different crops, like video frames
PSNR_CAP_DB = 100.0  # identical images have infinite PSNR; JSON holds this instead


@dataclass(frozen=True)
class GateLimits:
    """Pass thresholds (the issue's numbers by default)."""

    unet_max_abs_err_fp32: float = 1e-3
    face_psnr_db: float = 35.0
    whisper_rel_err: float = 1e-3


@dataclass(frozen=True)
class GateInputs:
    """Real inputs the gate feeds both runtimes: uint8 RGB face crops and 16 kHz speech."""

    crops: np.ndarray  # [K, 256, 256, 3] uint8
    pcm: np.ndarray  # float32 mono at 16 kHz


@dataclass
class GateResult:
    """The gate's numbers and verdict (stored in manifest.json)."""

    dtype: str
    batch: int
    whisper_rel_err: float
    unet_max_abs_err: float
    face_psnr_db: float
    limits: GateLimits
    failures: list[str] = field(default_factory=list)
    inputs: str = ""

    @property
    def passed(self) -> bool:
        """True when every number is within its limit."""
        return not self.failures

    @property
    def summary(self) -> str:
        """One line: the numbers and, on failure, which limit each broke."""
        numbers = (
            f"whisper rel err {self.whisper_rel_err:.2e}, unet max abs err {self.unet_max_abs_err:.2e}, "
            f"face PSNR {self.face_psnr_db:.1f} dB ({self.dtype}, batch {self.batch})"
        )
        return numbers if self.passed else f"FAILED: {'; '.join(self.failures)} [{numbers}]"

    def to_json(self) -> dict[str, Any]:
        """Plain JSON for the manifest."""
        out = asdict(self)
        out.update(passed=self.passed, summary=self.summary)
        return out


def face_crops(scales: tuple[float, ...] = CROP_SCALES) -> np.ndarray:
    """256x256 crops of the astronaut's face at a few box sizes, with the engine's Lanczos resize."""
    import cv2
    from skimage import data as skdata

    from lipstream.avatar.sample import FACE_CENTRE_IN_ASTRONAUT

    picture = skdata.astronaut()
    h, w = picture.shape[:2]
    cx, cy = FACE_CENTRE_IN_ASTRONAUT[0] * w, FACE_CENTRE_IN_ASTRONAUT[1] * h
    crops = []
    for scale in scales:
        half = 0.19 * w * scale  # about chin-to-brow: the crop box MuseTalk makes from landmarks
        x1, y1 = int(max(0, cx - half)), int(max(0, cy - half * 0.9))
        x2, y2 = int(min(w, cx + half)), int(min(h, cy + half * 1.1))
        face = np.ascontiguousarray(picture[y1:y2, x1:x2])
        crops.append(cv2.resize(face, (PATCH_SIZE, PATCH_SIZE), interpolation=cv2.INTER_LANCZOS4))
    return np.stack(crops)


def default_inputs() -> GateInputs:
    """The astronaut's face crops and the bundled Piper voice saying GATE_SENTENCE."""
    from lipstream.talk.voices.tts import create_tts

    speech = create_tts("piper", fallback=True).synthesize(GATE_SENTENCE)
    return GateInputs(crops=face_crops(), pcm=np.asarray(speech.pcm, dtype=np.float32).reshape(-1))


@dataclass(frozen=True)
class TorchReference:
    """What the torch engine (fp32, CPU) computes on the gate inputs."""

    mel: np.ndarray  # [1, 80, 3000] first segment's log-mel
    states: np.ndarray  # [1, 1500, S, D]
    latents: np.ndarray  # [B, 8, 32, 32] engine latents (fp16-rounded, as cached), fp32
    audio: np.ndarray  # [B, T, D] windowed features of B speaking frames
    pred: np.ndarray  # [B, 4, 32, 32] UNet output
    rgb: np.ndarray  # [B, 3, 256, 256] decoded face, 0..255


def torch_reference(models: Any, inputs: GateInputs, batch: int, pre_norm_last: bool) -> TorchReference:
    """Run the Python engine's code path on the gate inputs."""
    featurizer = WhisperFeaturizer(models.whisper, models.feature_extractor, pre_norm_last)
    pcm = inputs.pcm[: 30 * SAMPLE_RATE]
    mel = models.feature_extractor(pcm, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features
    with torch.inference_mode():
        states = stacked_states(models.whisper, torch.from_numpy(mel), pre_norm_last).numpy()
    features = featurizer.features(pcm)
    tokens, dim = WINDOW_STEPS * featurizer.n_states, featurizer.dim
    # frames spread over the speaking middle of the utterance (not the silent edges)
    picks = np.linspace(len(features) * 0.2, len(features) * 0.8, batch).astype(int)
    audio = features[picks].reshape(batch, tokens, dim).astype(np.float32)
    crops = inputs.crops[np.arange(batch) % len(inputs.crops)]
    latents = encode_crops(models.vae, crops).astype(np.float32)
    generator = MuseTalkGenerator(
        models.unet, models.vae, models.runtime, audio_tokens=tokens, batch_size=batch, warmup=False
    )
    pred = generator.predict(torch.from_numpy(latents), torch.from_numpy(audio))
    rgb = generator.decode(pred).permute(0, 3, 1, 2)
    return TorchReference(mel, states, latents, audio, pred.numpy(), rgb.numpy().astype(np.float32))


def psnr_db(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR of two 0..255 images (capped at PSNR_CAP_DB for identical ones)."""
    mse = float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))
    return PSNR_CAP_DB if mse == 0 else min(PSNR_CAP_DB, 10 * math.log10(255.0**2 / mse))


def _session(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _input_dtype(session) -> type:
    return np.float16 if session.get_inputs()[0].type == "tensor(float16)" else np.float32


def run_gate(
    folder: Path, ref: TorchReference, dtype: str, batch: int, limits: GateLimits | None = None
) -> GateResult:
    """Run the graphs in `folder` (unet.onnx, vae_decoder.onnx, whisper_encoder.onnx) on ORT CPU and
    compare with the torch reference: the UNet is fed the same inputs, the decoder the ORT UNet's output."""
    limits = limits or GateLimits()
    whisper = _session(folder / "whisper_encoder.onnx")
    states = whisper.run(None, {"mel": ref.mel.astype(_input_dtype(whisper))})[0].astype(np.float32)
    whisper_err = float(np.max(np.abs(states - ref.states)) / max(1.0, float(np.max(np.abs(ref.states)))))
    del whisper
    unet = _session(folder / "unet.onnx")
    io = _input_dtype(unet)
    pred = unet.run(None, {"latents": ref.latents.astype(io), "audio": ref.audio.astype(io)})[0]
    del unet
    unet_err = float(np.max(np.abs(pred.astype(np.float32) - ref.pred)))
    decoder = _session(folder / "vae_decoder.onnx")
    rgb = decoder.run(None, {"latents": pred.astype(_input_dtype(decoder))})[0].astype(np.float32)
    del decoder
    psnr = psnr_db(rgb, ref.rgb)
    failures = []
    if not whisper_err <= limits.whisper_rel_err:
        failures.append(f"whisper states rel err {whisper_err:.2e} > {limits.whisper_rel_err:.0e}")
    if dtype == "float32" and not unet_err <= limits.unet_max_abs_err_fp32:
        failures.append(f"unet latents max abs err {unet_err:.2e} > {limits.unet_max_abs_err_fp32:.0e}")
    if not psnr >= limits.face_psnr_db:
        failures.append(f"decoded face PSNR {psnr:.2f} dB < {limits.face_psnr_db:.0f} dB vs torch fp32")
    return GateResult(
        dtype=dtype,
        batch=batch,
        whisper_rel_err=whisper_err,
        unet_max_abs_err=unet_err,
        face_psnr_db=psnr,
        limits=limits,
        failures=failures,
        inputs="astronaut face crops (VAE posterior means, fp16 as cached) + Piper speech via Whisper",
    )

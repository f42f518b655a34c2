"""Per-avatar cache: VAE latents of each frame's lower-half-masked crop and its unmasked reference crop.

Crops follow upstream: frame[y1:y2, x1:x2] resized to 256x256 with Lanczos-4. Upstream reads BGR, crops,
resizes and converts to RGB before the VAE; our frames are already RGB, so the VAE sees the same pixels.
Stored as engines/musetalk/latents.npy, fp16 [N, 8, 32, 32] (channels 0-3 masked, 4-7 reference).
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

import numpy as np
import torch

from lipstream.avatar.bundle import AvatarBundle
from lipstream.engines.musetalk.generator import PATCH_SIZE
from lipstream.errors import AvatarError
from lipstream.files import atomic_file

log = logging.getLogger(__name__)

ENGINE = "musetalk"
LATENTS_FILE = "latents.npy"
ENCODE_BATCH = 4
# The bundle's boxes hold MuseTalk v1.5's jaw margin below the chin (avatar/boxes.py BoxConfig: 10 px, or a
# share of the box for a large face); upstream adds it for v1.5 only, so v1.0 crops the box without it. The
# value marks which crop a latents cache was encoded from (-10: without the margin, whatever its size).
JAW_MARGIN_PX = {"1.5": 0, "1.0": -10}


def version_box(box: np.ndarray, version: str = "1.5", margin: float = 10.0) -> np.ndarray:
    """The crop box MuseTalk `version` reads from a bundle box: as is (v1.5) or without its jaw margin of
    `margin` rows (v1.0; `bundle_margins` gives each box's)."""
    x1, y1, x2, y2 = (int(v) for v in box)
    if JAW_MARGIN_PX.get(version, 0):
        y2 -= int(round(margin))
    return np.array([x1, y1, x2, max(y1 + 2, y2)], dtype=np.int64)


def bundle_margins(bundle: AvatarBundle) -> np.ndarray:
    """Per frame, the rows its box holds under the chin (as prepare made them)."""
    from lipstream.avatar.boxes import chin_margins

    return chin_margins(np.asarray(bundle.boxes), bundle.manifest.box)


def to_bundle_crop(
    patch: np.ndarray, frame: np.ndarray, box: np.ndarray, version: str, margin: float = 10.0
) -> np.ndarray:
    """A 256x256 patch of version_box(box) mapped onto the bundle box's 256x256 crop space: the patch is
    resized into the rows it covers and the rows below (v1.0's missing jaw margin) keep the frame's own."""
    import cv2

    inner = version_box(box, version, margin)
    if inner[3] == int(box[3]):
        return patch
    crop = crop_face(frame, box)
    rows = int(round(PATCH_SIZE * (inner[3] - inner[1]) / max(1, int(box[3]) - int(box[1]))))
    rows = min(PATCH_SIZE, max(1, rows))
    crop[:rows] = cv2.resize(patch, (PATCH_SIZE, rows), interpolation=cv2.INTER_LINEAR)
    return crop


def crop_face(frame: np.ndarray, box: np.ndarray) -> np.ndarray:
    """The frame's face box resized to 256x256 RGB with Lanczos-4 (upstream's crop)."""
    import cv2  # imported here: the GPU benchmark imports this room without cv2

    x1, y1, x2, y2 = (int(v) for v in box)
    h, w = frame.shape[:2]
    x1, y1, x2, y2 = max(0, x1), max(0, y1), min(w, x2), min(h, y2)
    if x2 <= x1 or y2 <= y1:
        raise AvatarError(
            f"face box {tuple(int(v) for v in box)} is empty inside a {w}x{h} frame; re-prepare the avatar"
        )
    return cv2.resize(
        np.ascontiguousarray(frame[y1:y2, x1:x2]), (PATCH_SIZE, PATCH_SIZE), interpolation=cv2.INTER_LANCZOS4
    )


def vae_inputs(crops: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 RGB crops [B,256,256,3] -> (masked, reference) tensors in [-1, 1]; masked rows >= 128 are -1."""
    ref = torch.from_numpy(np.ascontiguousarray(crops)).permute(0, 3, 1, 2).float() / 255.0
    masked = ref.clone()
    masked[:, :, PATCH_SIZE // 2 :, :] = 0.0  # upstream zeroes the lower half before normalising -> -1
    return masked * 2 - 1, ref * 2 - 1


def encode_crops(vae: Any, crops: np.ndarray) -> np.ndarray:
    """fp16 latents [B, 8, 32, 32]: posterior means (not samples) of masked then reference crops, scaled."""
    param = next(vae.parameters())
    masked, ref = vae_inputs(crops)
    with torch.inference_mode():
        both = torch.cat([masked, ref]).to(device=param.device, dtype=param.dtype)
        # the mean, not upstream's sample(): deterministic, and v1.5 was trained on mode() latents
        lat = vae.encode(both).latent_dist.mean * float(vae.config.scaling_factor)
        b = len(crops)
        return torch.cat([lat[:b], lat[b:]], dim=1).float().cpu().numpy().astype(np.float16)


def vae_fingerprint(vae: Any) -> str:
    """Short hash of the VAE's config and a slice of its weights: cached latents belong to one VAE."""
    digest = hashlib.sha256(json.dumps(dict(vae.config), sort_keys=True, default=str).encode())
    for name, tensor in sorted(vae.state_dict().items())[:4]:
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().reshape(-1)[:256].numpy().tobytes())
    return digest.hexdigest()[:16]


def cached_latents(bundle: AvatarBundle, fingerprint: str, version: str = "1.5") -> np.ndarray | None:
    """The bundle's latents if present, complete and made by this VAE from this version's crop; else None."""
    entry = bundle.manifest.engines.get(ENGINE, {})
    path = bundle.engine_dir(ENGINE) / entry.get("latents", LATENTS_FILE)
    if not path.is_file() or entry.get("vae") != fingerprint:
        return None
    if int(entry.get("crop_bottom_px", 0)) != JAW_MARGIN_PX.get(version, 0):
        return None  # made for the other version's crop: re-encode (once per switch)
    try:
        latents = np.load(path, mmap_mode="r")
    except (OSError, ValueError):
        return None
    if latents.ndim != 4 or latents.shape[0] != len(bundle.display_frames):
        return None
    return latents


def frame_rows(bundle: AvatarBundle) -> np.ndarray:
    """Per source frame, its row in the stored latents (-1: never shown by the idle loop, not encoded)."""
    rows = np.full(bundle.frame_count, -1, dtype=np.int64)
    shown = bundle.display_frames
    rows[shown] = np.arange(len(shown))
    return rows


def latents_by_frame(bundle: AvatarBundle, latents: np.ndarray) -> np.ndarray:
    """The stored rows spread to one per source frame (zeros for frames never shown), for the web page."""
    full = np.zeros((bundle.frame_count, *latents.shape[1:]), dtype=latents.dtype)
    full[bundle.display_frames] = latents
    return full


def prepare_latents(
    bundle: AvatarBundle, vae: Any, progress: bool = True, version: str = "1.5"
) -> np.ndarray:
    """Encode the crops (version_box) of every frame the idle loop shows (all of them in a short clip; a
    long clip's other frames are never drawn on) once, store them atomically in the bundle, return them.
    Row i belongs to frame display_frames[i] (see frame_rows)."""
    fingerprint = vae_fingerprint(vae)
    existing = cached_latents(bundle, fingerprint, version)
    if existing is not None:
        return existing
    shown = bundle.display_frames
    n = len(shown)
    margins = bundle_margins(bundle)
    chunks = []
    from rich.progress import Progress

    with Progress(disable=not progress, transient=True) as bar:
        task = bar.add_task(f"MuseTalk latents for '{bundle.name}'", total=n)
        for start in range(0, n, ENCODE_BATCH):
            idx = [int(i) for i in shown[start : start + ENCODE_BATCH]]
            crops = np.stack(
                [
                    crop_face(np.asarray(bundle.frames[i]), version_box(bundle.boxes[i], version, margins[i]))
                    for i in idx
                ]
            )
            chunks.append(encode_crops(vae, crops))
            bar.advance(task, len(idx))
    latents = np.concatenate(chunks)
    folder = bundle.engine_dir(ENGINE)
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_file(folder / LATENTS_FILE) as fh:
        np.save(fh, latents)
    bundle.update_engine_entry(
        ENGINE,
        {
            "latents": LATENTS_FILE,
            "shape": list(latents.shape),
            "rows": "one per frame the idle loop shows, in frame order",
            "dtype": "float16",
            "channels": "0-3 lower-half-masked crop, 4-7 reference crop",
            "posterior": "mean",
            "crop": "box resized to 256x256, INTER_LANCZOS4, RGB",
            "crop_bottom_px": JAW_MARGIN_PX.get(version, 0),  # v1.0: the box without v1.5's jaw margin
            "vae": fingerprint,
        },
    )
    log.info("stored MuseTalk latents %s in %s", latents.shape, folder)
    return latents

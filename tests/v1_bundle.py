"""A format-1 bundle (raw frames.npy and masks.npy, as lipstream wrote them before format 2), written from
a prepared bundle by following docs/bundle-format.md's format-1 section, for the tests that read and
upgrade old bundles."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from lipstream.avatar import bundle as bf
from lipstream.avatar.masks import mouth_masks
from lipstream.avatar.prepare import crop_space, idle_loop


def write_v1_bundle(source: bf.AvatarBundle, folder: Path) -> Path:
    """Write `source`'s frames and arrays as a format-1 bundle in `folder` (its idle loop: the whole clip)."""
    folder.mkdir(parents=True)
    n = source.frame_count
    frames = np.lib.format.open_memmap(folder / bf.FRAMES, "w+", np.uint8, source.frames.shape)
    for k in range(n):
        frames[k] = source.frames[k]
    frames.flush()
    del frames
    masks, nose = mouth_masks(crop_space(source.landmarks, source.boxes, bf.CROP_SIZE), bf.CROP_SIZE)
    np.save(folder / bf.MASKS, masks)
    np.save(folder / bf.NOSE_BASE, nose)
    np.save(folder / bf.IDLE_LOOP, idle_loop(n))
    for name in (bf.BOXES, bf.LANDMARKS, bf.TRACKED):
        shutil.copyfile(source.path / name, folder / name)
    manifest = source.manifest.model_dump(exclude={"video", "mask", "idle"})
    manifest.update(format_version=1, name=folder.name, engines={})
    (folder / bf.MANIFEST).write_text(json.dumps(manifest, indent=2))
    return folder

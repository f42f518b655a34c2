"""Each frame's crop (its face box resized to 256², the warp's source), stored or made on demand."""

from __future__ import annotations

import threading

import cv2
import numpy as np

from lipstream.avatar.bundle import CROP_SIZE, AvatarBundle
from lipstream.errors import AvatarError


def source_crop(bundle: AvatarBundle, frame_index: int) -> np.ndarray:
    """The frame's face box resized to CROP_SIZE² (INTER_AREA: boxes are larger than the crop)."""
    x1, y1, x2, y2 = (int(v) for v in bundle.boxes[frame_index])
    region = np.asarray(bundle.frames[frame_index][y1:y2, x1:x2])
    if region.size == 0:
        raise AvatarError(f"avatar '{bundle.name}' frame {frame_index} has an empty face box; re-prepare it")
    return cv2.resize(region, (CROP_SIZE, CROP_SIZE), interpolation=cv2.INTER_AREA)


class DerivedCrops:
    """Crops of a format-2 bundle, made from its decoded frames when asked for (it stores none).

    The frames the idle loop shows are kept once made (every render draws on them again); any other
    frame's crop (the mouth atlas reads each once) is made and handed back without being kept, so
    reading a long clip's crops in order holds one GOP of decoded frames, not the clip."""

    def __init__(self, bundle: AvatarBundle) -> None:
        self.bundle = bundle
        self._keep = set(int(i) for i in bundle.display_frames)
        self._kept: dict[int, np.ndarray] = {}
        self._lock = threading.Lock()

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """N×256×256×3, as the stored crops.npy of format 1."""
        return (self.bundle.frame_count, CROP_SIZE, CROP_SIZE, 3)

    def __len__(self) -> int:
        return self.bundle.frame_count

    def __getitem__(self, index: int) -> np.ndarray:
        index = int(index)
        crop = self._kept.get(index)
        if crop is not None:
            return crop
        with self._lock:  # one decoder per bundle: make crops one at a time
            crop = self._kept.get(index)
            if crop is None:
                crop = source_crop(self.bundle, index)
                crop.flags.writeable = False
                if index in self._keep:
                    self._kept[index] = crop
        return crop

    def warm(self) -> None:
        """Make every shown frame's crop now (in idle-loop order: one pass through the loop video), then
        let the decoded frames go."""
        for index in np.asarray(self.bundle.idle_loop)[: len(self._keep)]:
            self[int(index)]
        for index in sorted(self._keep - set(self._kept)):
            self[index]
        release = getattr(self.bundle.frames, "release", None)
        if release is not None:
            release()

"""Each frame's crop (its face box resized to 256², the warp's source), stored or made on demand."""

from __future__ import annotations

import os
import tempfile
import threading
from pathlib import Path

import cv2
import numpy as np

from lipstream.avatar.bundle import CROP_SIZE, AvatarBundle
from lipstream.avatar.bundle_video import VideoFrames
from lipstream.errors import AvatarError
from lipstream.media.gop_video import GopReader, Mp4FrameWriter, VideoEncoding

CROPS_VIDEO = "crops.mp4"  # format 2: the shown frames' crops in frame order (row i: display_frames[i])
# Near-lossless (~48 dB) at 256²: ~20 kB a crop, decoded in well under a millisecond.
CROPS_ENCODING = VideoEncoding(crf=10)


def source_crop(bundle: AvatarBundle, frame_index: int) -> np.ndarray:
    """The frame's face box resized to CROP_SIZE² (INTER_AREA: boxes are larger than the crop)."""
    x1, y1, x2, y2 = (int(v) for v in bundle.boxes[frame_index])
    region = np.asarray(bundle.frames[frame_index][y1:y2, x1:x2])
    if region.size == 0:
        raise AvatarError(f"avatar '{bundle.name}' frame {frame_index} has an empty face box; re-prepare it")
    return cv2.resize(region, (CROP_SIZE, CROP_SIZE), interpolation=cv2.INTER_AREA)


def write_crops_video(bundle: AvatarBundle, path: Path) -> None:
    """crops.mp4: the crop of every frame the idle loop shows, in frame order (written, then renamed; the
    temp name is unique, so workers preparing the same avatar at once never write into one file)."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".partial.mp4")
    os.close(fd)
    partial = Path(name)
    try:
        with Mp4FrameWriter(partial, CROP_SIZE, CROP_SIZE, bundle.manifest.fps, CROPS_ENCODING) as writer:
            for index in bundle.display_frames:
                writer.append(source_crop(bundle, int(index)))
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


class DerivedCrops:
    """Crops of a format-2 bundle: the shown frames' from the engine's crops.mp4 (when given), any other
    frame's made from the decoded footage when asked for.

    The shown frames' crops are kept once read (every render draws on them again); any other frame's crop
    (the mouth atlas reads each once) is handed back without being kept, so reading a long clip's crops
    in order holds one GOP of decoded frames, not the clip."""

    def __init__(self, bundle: AvatarBundle, video: Path | None = None) -> None:
        self.bundle = bundle
        shown = bundle.display_frames
        self._rows = {int(index): row for row, index in enumerate(shown)}
        self._keep = set(self._rows)
        self._video = (
            GopReader(video, len(shown), (CROP_SIZE, CROP_SIZE), CROPS_ENCODING.gop) if video else None
        )
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
                if self._video is not None and index in self._rows:
                    crop = self._video[self._rows[index]]
                else:
                    crop = source_crop(self.bundle, index)
                    crop.flags.writeable = False
                if index in self._keep:
                    self._kept[index] = crop
        return crop

    def warm(self) -> None:
        """Read (or make) every shown frame's crop now, in order, then let the decoded frames go."""
        for index in sorted(self._keep):
            self[index]
        if self._video is not None:
            self._video.release()
        if isinstance(self.bundle.frames, VideoFrames):  # decoded GOPs kept (format 2); a memory map has none
            self.bundle.frames.release()

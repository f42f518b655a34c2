"""VisemeEngine: the weight-free default engine (audio -> articulation -> landmark-driven mouth warp)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from lipstream.audio.levels import DEFAULT_SILENCE_DBFS, SilenceDetector
from lipstream.avatar.bundle import CROP_SIZE, AvatarBundle
from lipstream.engines.base import FeatureStream, Speech
from lipstream.engines.viseme.articulation import FEATURE_DIM, FEATURE_NAMES, OPEN
from lipstream.engines.viseme.calibration import OpeningCurve, measure_opening_curve
from lipstream.engines.viseme.extractor import ArticulationExtractor, StreamingArticulation
from lipstream.engines.viseme.geometry import GEOMETRY_DIM, MouthGeometry, measure
from lipstream.engines.viseme.model import load_model
from lipstream.engines.viseme.warp import WarpConfig, render_patch
from lipstream.errors import AvatarError

CROPS_FILE = "crops.npy"  # N×256×256×3 uint8: each frame's box resized to crop space
GEOMETRY_FILE = "geometry.npy"  # N×GEOMETRY_DIM float32: packed MouthGeometry rows
OPENING_FILE = "opening.npy"  # 2×L float32: warp opening levels and the aperture tracked at each
CACHE_VERSION = 3


@dataclass(frozen=True)
class _AvatarCache:
    crops: np.ndarray
    geometry: np.ndarray
    opening: OpeningCurve


def source_crop(bundle: AvatarBundle, frame_index: int) -> np.ndarray:
    """The frame's face box resized to CROP_SIZE² (INTER_AREA: boxes are larger than the crop)."""
    x1, y1, x2, y2 = (int(v) for v in bundle.boxes[frame_index])
    region = np.asarray(bundle.frames[frame_index][y1:y2, x1:x2])
    if region.size == 0:
        raise AvatarError(f"avatar '{bundle.name}' frame {frame_index} has an empty face box; re-prepare it")
    return cv2.resize(region, (CROP_SIZE, CROP_SIZE), interpolation=cv2.INTER_AREA)


class VisemeEngine:
    """Weight-free lip-sync on a CPU: phoneme timings or a 104 kB acoustic model drive a warp of the lips."""

    name = "viseme"
    feature_kind = "viseme"
    feature_dim = FEATURE_DIM
    patch_size = CROP_SIZE
    batch_size = 8
    # Rendering costs ~2 ms a frame, less than acceleration could save, and cross-fade infill between
    # keyframes measurably loosens lip-sync (docs/benchmarks.md): off unless asked for (--accel).
    accelerate_by_default = False

    def __init__(
        self,
        model_path: str | os.PathLike | None = None,
        use_phonemes: bool = True,
        silence_dbfs: float = DEFAULT_SILENCE_DBFS,
        warp: WarpConfig | None = None,
    ) -> None:
        """Load the acoustic model; use_phonemes=False ignores TTS timings (audio-only features)."""
        self.use_phonemes = use_phonemes
        self.extractor = ArticulationExtractor(
            load_model(model_path), SilenceDetector(threshold_dbfs=silence_dbfs)
        )
        self.lookahead_frames = self.extractor.lookahead_frames
        self.warp = warp or WarpConfig()
        # Patch caches kept by others (the render codebook) are valid only for this warp and cache layout.
        digest = hashlib.sha1(f"{CACHE_VERSION}:{self.warp!r}".encode()).hexdigest()[:8]
        self.cache_key = f"w{digest}"
        self.feature_names = FEATURE_NAMES
        self._caches: dict[Path, _AvatarCache] = {}

    # ---- features
    def features(self, speech: Speech) -> np.ndarray:
        """Per-frame articulation [frame_count, 3]: open, width, closure (TTS timings when known)."""
        return self.extractor.from_speech(speech, use_phonemes=self.use_phonemes)

    def stream_features(self) -> FeatureStream:
        """Incremental audio-only features for one live utterance."""
        return StreamingArticulation(self.extractor)

    # ---- avatar caches
    def prepare(self, bundle: AvatarBundle) -> None:
        """Cache resized crops and mouth geometry under engines/viseme (idempotent)."""
        folder = bundle.engine_dir(self.name)
        entry = bundle.manifest.engines.get(self.name, {})
        if (
            entry.get("version") == CACHE_VERSION
            and entry.get("frames") == bundle.frame_count
            and entry.get("warp") == self.cache_key
            and (folder / CROPS_FILE).is_file()
            and (folder / GEOMETRY_FILE).is_file()
            and (folder / OPENING_FILE).is_file()
        ):
            return
        crops, geometry = self._build(bundle)
        opening = self._calibrate(bundle, crops, geometry)
        folder.mkdir(parents=True, exist_ok=True)
        # Patches cached from the previous crops/calibration would no longer match what render() draws.
        for stale in folder.glob("codebook*.npz"):
            stale.unlink()
        for name, array in ((CROPS_FILE, crops), (GEOMETRY_FILE, geometry), (OPENING_FILE, opening.pack())):
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                np.save(fh, array)
            os.replace(tmp, folder / name)
        bundle.update_engine_entry(
            self.name,
            {
                "version": CACHE_VERSION,
                "frames": bundle.frame_count,
                "crops": CROPS_FILE,
                "geometry": GEOMETRY_FILE,
                "opening": OPENING_FILE,
                "warp": self.cache_key,  # the opening calibration was measured with this warp
            },
        )
        self._caches.pop(Path(bundle.path), None)

    def _build(self, bundle: AvatarBundle) -> tuple[np.ndarray, np.ndarray]:
        """Compute every frame's crop and packed geometry in memory."""
        n = bundle.frame_count
        crops = np.empty((n, CROP_SIZE, CROP_SIZE, 3), dtype=np.uint8)
        geometry = np.empty((n, GEOMETRY_DIM), dtype=np.float32)
        for i in range(n):
            crops[i] = source_crop(bundle, i)
            geometry[i] = measure(bundle.crop_landmarks(i), float(bundle.nose_base[i])).pack()
        return crops, geometry

    def _calibrate(self, bundle: AvatarBundle, crops: np.ndarray, geometry: np.ndarray) -> OpeningCurve:
        """Aperture the tracker reads at each warp opening, on a few of this avatar's frames."""

        def render_open(level: float, fid: int) -> np.ndarray:
            row = np.array([level, 0.0, 0.0], dtype=np.float32)
            geo = MouthGeometry.unpack(geometry[fid])
            return render_patch(np.asarray(crops[fid]), np.asarray(bundle.masks[fid]), geo, row, self.warp)

        return measure_opening_curve(bundle, render_open)

    def _cache(self, bundle: AvatarBundle) -> _AvatarCache:
        """Crops and geometry: from the prepared cache, else computed in memory (never written here)."""
        key = Path(bundle.path)
        if key not in self._caches:
            folder = bundle.engine_dir(self.name)
            entry = bundle.manifest.engines.get(self.name, {})
            if (
                entry.get("version") == CACHE_VERSION
                and entry.get("warp") == self.cache_key
                and (folder / CROPS_FILE).is_file()
            ):
                crops = np.load(folder / CROPS_FILE, mmap_mode="r")
                geometry = np.load(folder / GEOMETRY_FILE)
                opening = OpeningCurve.unpack(np.load(folder / OPENING_FILE))
            else:
                crops, geometry = self._build(bundle)
                opening = self._calibrate(bundle, crops, geometry)
            self._caches[key] = _AvatarCache(crops, geometry, opening)
        return self._caches[key]

    # ---- rendering
    def render(self, bundle: AvatarBundle, features: np.ndarray, frame_ids: np.ndarray) -> np.ndarray:
        """Mouth patches [B, 256, 256, 3] uint8 RGB in crop space, one per (feature row, frame id)."""
        features = np.asarray(features, dtype=np.float32).reshape(-1, FEATURE_DIM)
        frame_ids = np.asarray(frame_ids).reshape(-1)
        if len(features) != len(frame_ids):
            raise ValueError(f"{len(features)} feature rows for {len(frame_ids)} frame ids")
        cache = self._cache(bundle)
        features = features.copy()
        features[:, OPEN] = cache.opening.warp_opening(features[:, OPEN])
        out = np.empty((len(frame_ids), CROP_SIZE, CROP_SIZE, 3), dtype=np.uint8)
        for i, (row, fid) in enumerate(zip(features, frame_ids, strict=True)):
            fid = int(fid)
            geo = MouthGeometry.unpack(cache.geometry[fid])
            out[i] = render_patch(
                np.asarray(cache.crops[fid]), np.asarray(bundle.masks[fid]), geo, row, self.warp
            )
        return out

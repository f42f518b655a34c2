"""VisemeEngine: the weight-free default engine (audio -> articulation -> landmark-driven mouth warp)."""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lipstream.audio.levels import DEFAULT_SILENCE_DBFS, SilenceDetector
from lipstream.avatar.bundle import CROP_SIZE, AvatarBundle
from lipstream.engines.base import Engine, FeatureStream, Speech
from lipstream.engines.viseme.articulation import CLOSURE, FEATURE_DIM, FEATURE_NAMES, OPEN
from lipstream.engines.viseme.atlas import (
    ATLAS_FILE,
    ATLAS_VERSION,
    STABLE,
    AtlasConfig,
    AtlasQuality,
    MouthAtlas,
    UnitChoice,
    build_atlas,
    choose_units,
    join_costs,
    judge,
    load_atlas,
    place_patch,
    save_atlas,
    target_costs,
    unit_patch,
)
from lipstream.engines.viseme.calibration import OpeningCurve, measure_opening_curve
from lipstream.engines.viseme.crops import CROPS_VIDEO, DerivedCrops, source_crop, write_crops_video
from lipstream.engines.viseme.edges import EdgeConfig, ease_onset, release_rows
from lipstream.engines.viseme.extractor import ArticulationExtractor, StreamingArticulation
from lipstream.engines.viseme.geometry import GEOMETRY_DIM, MouthGeometry, measure
from lipstream.engines.viseme.model import load_model
from lipstream.engines.viseme.warp import WarpConfig, WarpRegion, avatar_teeth_rgb, render_patch, warp_region
from lipstream.files import atomic_file

CROPS_FILE = "crops.npy"  # format-1 bundles: N×256×256×3 uint8, each frame's box resized to crop space
GEOMETRY_FILE = "geometry.npy"  # N×GEOMETRY_DIM float32: packed MouthGeometry rows
OPENING_FILE = "opening.npy"  # 2×L float32: warp opening levels and the aperture tracked at each
CACHE_VERSION = 4  # 4: calibrated in inner-lip gap / mouth width, capped at the speech range
MOUTH_MODES = ("auto", "drawn", "atlas")  # auto: the atlas when it is rich enough, else the drawn mouth


@dataclass(frozen=True)
class _AvatarCache:
    crops: np.ndarray | DerivedCrops
    geometry: np.ndarray
    opening: OpeningCurve
    warp: WarpConfig  # the engine's, drawing teeth in this presenter's own colour
    atlas: MouthAtlas | None = None
    quality: AtlasQuality | None = None
    join: np.ndarray | None = None  # [K, K] join costs of the atlas units
    # per frame id: its geometry and the warp's articulation-free part, made when the frame is first drawn
    frames: dict[int, tuple[MouthGeometry, WarpRegion | None]] = field(default_factory=dict)

    def frame_warp(self, fid: int) -> tuple[MouthGeometry, WarpRegion | None]:
        """The frame's mouth geometry and warp region (the same for every row drawn on it, so made once)."""
        made = self.frames.get(fid)
        if made is None:
            geo = MouthGeometry.unpack(self.geometry[fid])
            made = self.frames[fid] = (geo, warp_region(geo, CROP_SIZE, self.warp))
        return made

    @property
    def use_atlas(self) -> bool:
        """The atlas is present and rich enough to choose mouths from."""
        return self.atlas is not None and self.quality is not None and self.quality.usable


def stores_crops(bundle: AvatarBundle) -> bool:
    """Format-1 bundles keep every frame's crop raw (crops.npy); format 2 keeps the shown frames' crops in a
    near-lossless crops.mp4 (~4 MB for a 6 s loop instead of ~30 MB), others are made when asked for."""
    return bundle.manifest.format_version < 2


class VisemeEngine(Engine):
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
        mouth: str = "auto",
        atlas: AtlasConfig | None = None,
        edges: EdgeConfig | None = None,
    ) -> None:
        """Load the acoustic model; use_phonemes=False ignores TTS timings (audio-only features).

        mouth: "auto" uses the avatar's mouth atlas when it is rich enough, "drawn" always warps the
        base frame's own mouth, "atlas" asks for the atlas (still drawn, with a note, if it is too poor).
        """
        if mouth not in MOUTH_MODES:
            raise ValueError(f"unknown mouth mode '{mouth}'; use one of {', '.join(MOUTH_MODES)}")
        self.use_phonemes = use_phonemes
        self.mouth = mouth
        self.atlas_config = atlas or AtlasConfig()
        self.edges = edges or EdgeConfig()
        # The atlas mouth shown last per avatar (and its cross-fade), so the next batch joins and fades on.
        self._last_unit: dict[Path, UnitChoice] = {}
        self.extractor = ArticulationExtractor(
            load_model(model_path), SilenceDetector(threshold_dbfs=silence_dbfs)
        )
        self.lookahead_frames = self.extractor.lookahead_frames
        self.warp = warp or WarpConfig()
        # Patch caches kept by others (the render codebook) are valid only for this warp and cache layout.
        digest = hashlib.sha1(f"{CACHE_VERSION}:{self.warp!r}:{mouth}:{ATLAS_VERSION}".encode()).hexdigest()[
            :8
        ]
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

    def onset(self, feats: np.ndarray, first_row: int) -> np.ndarray:
        """An utterance's rows from `first_row` on, for one that starts from the footage's own mouth."""
        return ease_onset(feats, first_row, self.edges)

    def release(self, last_row: np.ndarray) -> np.ndarray:
        """Rows for the frames after an utterance, back from its last row to the footage's own mouth."""
        return release_rows(last_row, self.edges)

    # ---- avatar caches
    def prepare(self, bundle: AvatarBundle) -> None:
        """Cache resized crops and mouth geometry under engines/viseme (idempotent), then load them, so the
        first render does not wait for them."""
        folder = bundle.engine_dir(self.name)
        crops = geometry = None
        if not self._cache_valid(bundle):
            previous = bundle.manifest.engines.get(self.name, {})
            crops, geometry = self._build(bundle)
            opening = self._calibrate(bundle, crops, geometry, self._avatar_warp(bundle, crops, geometry))
            folder.mkdir(parents=True, exist_ok=True)
            # Patches cached from the previous crops/calibration would no longer match what render() draws.
            for stale in folder.glob("codebook*.npz"):
                stale.unlink()
            arrays = [(GEOMETRY_FILE, geometry), (OPENING_FILE, opening.pack())]
            if stores_crops(bundle):
                arrays.append((CROPS_FILE, crops))
            for name, array in arrays:
                with atomic_file(folder / name) as fh:
                    np.save(fh, array)
            entry = {
                "version": CACHE_VERSION,
                "frames": bundle.frame_count,
                "geometry": GEOMETRY_FILE,
                "opening": OPENING_FILE,
                "warp": self.cache_key,  # the opening calibration was measured with this warp
            }
            if stores_crops(bundle):
                entry["crops"] = CROPS_FILE
            elif (folder / CROPS_VIDEO).is_file():  # made from the frames alone: still right
                entry["crops"] = CROPS_VIDEO
            if "atlas" in previous:  # the filmed mouths do not depend on the warp; _ensure_atlas checks it
                entry["atlas"] = previous["atlas"]
            bundle.update_engine_entry(self.name, entry)
            self._caches.pop(Path(bundle.path), None)
        if not stores_crops(bundle) and not (folder / CROPS_VIDEO).is_file():
            write_crops_video(bundle, folder / CROPS_VIDEO)  # an upgraded bundle keeps its calibration
            bundle.update_engine_entry(
                self.name, {**bundle.manifest.engines[self.name], "crops": CROPS_VIDEO}
            )
            self._caches.pop(Path(bundle.path), None)
        self._ensure_atlas(bundle, crops, geometry)
        self._cache(bundle)

    def _cache_valid(self, bundle: AvatarBundle) -> bool:
        """The bundle's engines/viseme geometry and calibration (and format 1's crops) are there and were
        made by this engine's warp (format 2's crops.mp4 is checked on its own)."""
        folder = bundle.engine_dir(self.name)
        entry = bundle.manifest.engines.get(self.name, {})
        files = [GEOMETRY_FILE, OPENING_FILE] + ([CROPS_FILE] if stores_crops(bundle) else [])
        return (
            entry.get("version") == CACHE_VERSION
            and entry.get("frames") == bundle.frame_count
            and entry.get("warp") == self.cache_key
            and all((folder / name).is_file() for name in files)
        )

    def avatar_crops(self, bundle: AvatarBundle) -> np.ndarray | DerivedCrops:
        """The crops render() draws on, after prepare(): stored (format 1) or made on demand (format 2)."""
        return self._cache(bundle).crops

    def _crops(self, bundle: AvatarBundle) -> np.ndarray | DerivedCrops:
        """The stored crops (format 1) or crops made from the frames on demand (format 2)."""
        folder = bundle.engine_dir(self.name)
        if stores_crops(bundle):
            return np.load(folder / CROPS_FILE, mmap_mode="r")
        return DerivedCrops(bundle, folder / CROPS_VIDEO if (folder / CROPS_VIDEO).is_file() else None)

    def _ensure_atlas(
        self, bundle: AvatarBundle, crops: np.ndarray | None = None, geometry: np.ndarray | None = None
    ) -> None:
        """Build and store the mouth atlas if the bundle has none yet (bundles prepared before it existed)."""
        folder = bundle.engine_dir(self.name)
        entry = bundle.manifest.engines.get(self.name, {})
        atlas_entry = entry.get("atlas", {})
        if atlas_entry.get("version") == ATLAS_VERSION and (folder / ATLAS_FILE).is_file():
            return
        if crops is None:
            print(
                f"avatar '{bundle.name}': adding a mouth atlas from its own frames (once; "
                "`lipstream avatar atlas NAME` does the same ahead of time)",
                file=sys.stderr,
            )
            crops = self._crops(bundle)
            geometry = np.load(folder / GEOMETRY_FILE)
        atlas = self._build_atlas(bundle, crops, geometry)
        quality = judge(atlas, self.atlas_config)
        folder.mkdir(parents=True, exist_ok=True)
        size = save_atlas(folder / ATLAS_FILE, atlas)
        for stale in folder.glob("codebook*.npz"):  # patches cached before the atlas was there
            stale.unlink()
        entry = dict(bundle.manifest.engines.get(self.name, {}))
        entry["atlas"] = {
            "version": ATLAS_VERSION,
            "file": ATLAS_FILE,
            "units": quality.units,
            "frames_used": atlas.frames_used,
            "frames_total": atlas.frames_total,
            "coverage": round(quality.coverage, 3),
            "aperture_span": round(quality.aperture_span, 4),
            "usable": quality.usable,
            "reason": quality.reason,
            "bytes": size,
        }
        bundle.update_engine_entry(self.name, entry)
        self._caches.pop(Path(bundle.path), None)

    def _build_atlas(
        self, bundle: AvatarBundle, crops: np.ndarray | DerivedCrops, geometry: np.ndarray
    ) -> MouthAtlas:
        """The mouth atlas of this avatar, in memory."""
        landmarks = np.stack([bundle.crop_landmarks(i) for i in range(bundle.frame_count)])
        tracked = (
            np.asarray(bundle.tracked, bool)
            if bundle.tracked is not None
            else np.ones(bundle.frame_count, bool)
        )
        typical = np.median(geometry, axis=0)
        geo = MouthGeometry.unpack(typical)
        return build_atlas(
            crops,
            landmarks,
            tracked,
            (geo.center_x, geo.half_width, geo.nose_y, geo.chin_y),
            self.atlas_config,
        )

    def mouth_source(self, bundle: AvatarBundle) -> str:
        """One line for reports: which mouth this avatar renders with, and why."""
        cache = self._cache(bundle)
        q = cache.quality
        if self.mouth == "drawn":
            return "mouth: drawn (asked for with mouth=drawn)"
        if q is None:
            return "mouth: drawn (no mouth atlas)"
        if cache.use_atlas:
            return f"mouth: atlas ({q.units} filmed mouths, coverage {q.coverage:.2f})"
        return f"mouth: drawn (mouth atlas too poor: {q.reason})"

    def _build(self, bundle: AvatarBundle) -> tuple[np.ndarray | DerivedCrops, np.ndarray]:
        """Every frame's crop (format 1: computed in memory; format 2: made on demand) and packed geometry."""
        n = bundle.frame_count
        geometry = np.empty((n, GEOMETRY_DIM), dtype=np.float32)
        for i in range(n):
            geometry[i] = measure(bundle.crop_landmarks(i), float(bundle.nose_base[i])).pack()
        if not stores_crops(bundle):
            return DerivedCrops(bundle), geometry
        crops = np.empty((n, CROP_SIZE, CROP_SIZE, 3), dtype=np.uint8)
        for i in range(n):
            crops[i] = source_crop(bundle, i)
        return crops, geometry

    def _avatar_warp(
        self, bundle: AvatarBundle, crops: np.ndarray | DerivedCrops, geometry: np.ndarray
    ) -> WarpConfig:
        """The warp drawing teeth in the presenter's own colour, sampled on the shown frames' mouths (the
        engine's warp as it is when `sample_teeth` is off: nothing is sampled then)."""
        if not self.warp.sample_teeth:
            return self.warp
        shown = np.unique(np.asarray(bundle.idle_loop))
        own = avatar_teeth_rgb(lambda fid: np.asarray(crops[fid]), geometry, shown, self.warp)
        return self.warp.with_own_teeth(own)

    def avatar_warp(self, bundle: AvatarBundle) -> WarpConfig:
        """The warp this avatar is drawn with (the engine's, in its own teeth colour): what a port runs."""
        return self._cache(bundle).warp

    def _calibrate(
        self, bundle: AvatarBundle, crops: np.ndarray | DerivedCrops, geometry: np.ndarray, warp: WarpConfig
    ) -> OpeningCurve:
        """Aperture the tracker reads at each warp opening, on a few of this avatar's frames."""

        def render_open(level: float, fid: int) -> np.ndarray:
            row = np.zeros(FEATURE_DIM, dtype=np.float32)
            row[OPEN] = level
            geo = MouthGeometry.unpack(geometry[fid])
            return render_patch(np.asarray(crops[fid]), np.asarray(bundle.masks[fid]), geo, row, warp)

        return measure_opening_curve(bundle, render_open)

    def _cache(self, bundle: AvatarBundle) -> _AvatarCache:
        """Crops and geometry: from the prepared cache, else computed in memory (never written here)."""
        key = Path(bundle.path)
        if key not in self._caches:
            folder = bundle.engine_dir(self.name)
            if self._cache_valid(bundle):
                crops = self._crops(bundle)
                geometry = np.load(folder / GEOMETRY_FILE)
                warp = self._avatar_warp(bundle, crops, geometry)
                opening = OpeningCurve.unpack(np.load(folder / OPENING_FILE))
            else:
                crops, geometry = self._build(bundle)
                warp = self._avatar_warp(bundle, crops, geometry)
                opening = self._calibrate(bundle, crops, geometry, warp)
            atlas = None
            if self.mouth != "drawn":
                atlas = load_atlas(folder / ATLAS_FILE) if (folder / ATLAS_FILE).is_file() else None
                if atlas is None:  # not prepared: build it in memory (never written here)
                    atlas = self._build_atlas(bundle, crops, geometry)
            quality = judge(atlas, self.atlas_config) if atlas is not None else None
            join = join_costs(atlas) if quality is not None and quality.usable else None
            if isinstance(crops, DerivedCrops):
                crops.warm()  # the shown frames' crops now, not mid-stream
            self._caches[key] = _AvatarCache(crops, geometry, opening, warp, atlas, quality, join)
        return self._caches[key]

    # ---- rendering
    def render(self, bundle: AvatarBundle, features: np.ndarray, frame_ids: np.ndarray) -> np.ndarray:
        """Mouth patches [B, 256, 256, 3] uint8 RGB in crop space, one per (feature row, frame id).

        Rows are FEATURE_NAMES; rows of the first three only (open, width, closure) mean no f/v cue."""
        frame_ids = np.asarray(frame_ids).reshape(-1)
        features = np.asarray(features, dtype=np.float32)
        n = len(frame_ids)
        if features.size not in (n * FEATURE_DIM, n * (FEATURE_DIM - 1)):
            raise ValueError(
                f"viseme features need {FEATURE_DIM} columns ({', '.join(FEATURE_NAMES)}), one row per frame "
                f"id; got {features.size} values for {n} frame ids"
            )
        features = features.reshape(n, -1) if n else features.reshape(0, FEATURE_DIM)
        if features.shape[1] == FEATURE_DIM - 1:
            features = np.pad(features, ((0, 0), (0, 1)))
        cache = self._cache(bundle)
        if cache.use_atlas:
            return self._render_atlas(bundle, cache, features, frame_ids)
        features = features.copy()
        features[:, OPEN] = cache.opening.warp_opening(features[:, OPEN])
        out = np.empty((len(frame_ids), CROP_SIZE, CROP_SIZE, 3), dtype=np.uint8)
        for i, (row, fid) in enumerate(zip(features, frame_ids, strict=True)):
            fid = int(fid)
            geo, region = cache.frame_warp(fid)
            out[i] = render_patch(
                np.asarray(cache.crops[fid]), np.asarray(bundle.masks[fid]), geo, row, cache.warp, region
            )
        return out

    def _render_atlas(
        self, bundle: AvatarBundle, cache: _AvatarCache, features: np.ndarray, frame_ids: np.ndarray
    ) -> np.ndarray:
        """Filmed mouths chosen frame by frame, cross-faded at jumps, joined to the previous batch's last."""
        assert cache.atlas is not None and cache.join is not None
        key = Path(bundle.path)
        cost = target_costs(cache.atlas, features, self.atlas_config)
        # closed lips and nothing else is a pause (or a p/b/m): the closest-to-closed mouth, without a join
        speaking = np.delete(np.atleast_2d(features), CLOSURE, axis=1).any(axis=1)
        choices = choose_units(
            cache.atlas, cost, cache.join, speaking, self._last_unit.get(key), self.atlas_config
        )
        if choices:
            self._last_unit[key] = choices[-1]
        out = np.empty((len(frame_ids), CROP_SIZE, CROP_SIZE, 3), dtype=np.uint8)
        for i, (choice, fid) in enumerate(zip(choices, frame_ids, strict=True)):
            fid = int(fid)
            crop = np.asarray(cache.crops[fid])
            # Silent rows too: a filmed closed mouth (the base frame's may be mid-word in talking footage).
            stable = bundle.crop_landmarks(fid)[list(STABLE)]
            patch = unit_patch(cache.atlas, choice)
            out[i] = place_patch(cache.atlas, patch, crop, stable, np.asarray(bundle.masks[fid]))
        return out

"""The mouth atlas: the presenter's own filmed mouths, normalised so any of them can be placed on any frame.

Built once per avatar from its prepared frames (see docs/engines.md "mouth atlas"). Every usable source
frame's mouth region is mapped by a similarity transform fitted on stable landmarks (eye corners, nose)
into one canonical space and described by its lip shape; near-duplicates are dropped. At render time
`choose_units` picks one atlas mouth per frame by unit selection (a target cost plus a join cost to the
mouth shown before) and cross-fades over a few frames where the choice jumps to a mouth that does not
join smoothly; `place_unit` / `place_patch` put the (blended) mouth on the base frame, colour-matched.
The choice is causal, frame by frame, so how the frames are split into batches never changes a frame.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from lipstream.avatar.face_measures import INNER_LIP_RING, MOUTH_CORNERS, eye_width, lip_aperture
from lipstream.engines.viseme.articulation import CLOSURE, LABIODENTAL, OPEN, WIDTH
from lipstream.files import atomic_file

ATLAS_FILE = "atlas.npz"
ATLAS_VERSION = 1
# Stable face-mesh points for the similarity fit: outer/inner eye corners, nose bridge, tip and base.
STABLE = (33, 263, 133, 362, 168, 6, 197, 195, 5, 4, 1, 2)
_UPPER_OUTER, _UPPER_INNER, _LOWER_INNER, _LOWER_OUTER = 0, 13, 14, 17
# Descriptor columns (all in eye-corner distances, so they compare across frames and head sizes).
APERTURE, MOUTH_WIDTH, UPPER_LIP, LOWER_LIP, TEETH = range(5)
DESCRIPTOR_NAMES = ("aperture", "width", "upper_lip", "lower_lip", "teeth")


@dataclass(frozen=True)
class AtlasConfig:
    """How the atlas is built, judged and searched."""

    thumb: tuple[int, int] = (24, 16)  # grey thumbnail (w, h) for the join cost and de-duplication
    dedupe: float = 0.05  # a frame closer than this to a kept one (descriptor + thumbnail) is dropped
    max_units: int = 600
    min_range: float = 0.03  # aperture range (eye-corner widths) below which the mouth "never moves"
    min_units: int = 12
    min_coverage: float = 0.7  # share of target poses with an atlas mouth near them
    # Join cost in the choice, relative to the target cost. 0.2 (with a Viterbi over each batch) kept the
    # mouth smooth but lagged the sync; on the talking clip every step down was better on every measure
    # (0.01 / 0: re-tracked r 0.92 / 0.93, mouth PSNR 19.4 / 20.3 dB), so the join cost now only decides
    # where to cross-fade. Footage with more varied looks (lighting, teeth, head pose) may want ~0.01.
    join_weight: float = 0.0
    width_weight: float = 0.35
    teeth_weight: float = 0.5  # f/v: a filmed mouth showing no upper teeth costs this much more
    fade_above: float = 0.5  # join distance above which a change of mouth is a jump that gets cross-faded
    fade_max_open: float = 0.15  # ... unless the opening changes by more than this share of the range
    fade_frames: int = 2  # blended frames after a jump (weights 1/3, 2/3 of the new mouth); 0 = hard cut


@dataclass(frozen=True)
class MouthAtlas:
    """Canonical mouth images, their descriptors and source frames, and where the canonical box lies."""

    patches: np.ndarray  # [K, h, w, 3] uint8 RGB in canonical space
    descriptors: np.ndarray  # [K, 5] float32
    thumbs: np.ndarray  # [K, tw*th] float32 grey, zero-mean
    sources: np.ndarray  # [K] int32 source frame of each unit
    template: np.ndarray  # [len(STABLE), 2] float32 canonical positions of the stable points
    origin: np.ndarray  # [2] float32 canonical (x, y) of the patch's top-left corner
    frames_used: int  # source frames that passed the checks (before de-duplication)
    frames_total: int

    @property
    def aperture_range(self) -> tuple[float, float]:
        """(low, high) aperture: 2nd and 98th percentiles, robust to a stray frame."""
        a = self.descriptors[:, APERTURE]
        return float(np.percentile(a, 2)), float(np.percentile(a, 98))

    @property
    def width_range(self) -> tuple[float, float, float]:
        """(low, median, high) mouth width."""
        w = self.descriptors[:, MOUTH_WIDTH]
        return float(np.percentile(w, 5)), float(np.median(w)), float(np.percentile(w, 95))

    def nbytes(self) -> int:
        """Memory the atlas takes (its file is compressed and smaller)."""
        return int(sum(a.nbytes for a in (self.patches, self.descriptors, self.thumbs, self.sources)))


@dataclass(frozen=True)
class AtlasQuality:
    """Whether the atlas is rich enough to use, and why not."""

    units: int
    coverage: float
    aperture_span: float
    usable: bool
    reason: str


def describe(landmarks: np.ndarray, crop: np.ndarray) -> np.ndarray:
    """Shape descriptor of one frame's mouth from its crop-space landmarks (and the crop, for teeth)."""
    eye = eye_width(landmarks)
    d = np.zeros(len(DESCRIPTOR_NAMES), dtype=np.float32)
    d[APERTURE] = lip_aperture(landmarks)
    d[MOUTH_WIDTH] = np.linalg.norm(landmarks[MOUTH_CORNERS[0]] - landmarks[MOUTH_CORNERS[1]]) / eye
    d[UPPER_LIP] = np.linalg.norm(landmarks[_UPPER_OUTER] - landmarks[_UPPER_INNER]) / eye
    d[LOWER_LIP] = np.linalg.norm(landmarks[_LOWER_INNER] - landmarks[_LOWER_OUTER]) / eye
    # Teeth: share of the inner-lip area brighter than the skin beside the mouth.
    poly = np.rint(landmarks[list(INNER_LIP_RING)]).astype(np.int32)
    inner = np.zeros(crop.shape[:2], np.uint8)
    cv2.fillPoly(inner, [poly], 1)
    grey = cv2.cvtColor(crop, cv2.COLOR_RGB2GRAY)
    if inner.sum() >= 4:
        cx, cy = landmarks[MOUTH_CORNERS[1]].astype(int)
        skin = grey[max(cy - 3, 0) : cy + 4, min(cx + 4, grey.shape[1] - 1) : cx + 12]
        level = float(skin.mean()) if skin.size else 160.0
        d[TEETH] = float((grey[inner > 0] > level).mean())
    return d


def _similarity(src: np.ndarray, dst: np.ndarray) -> np.ndarray | None:
    """2×3 similarity transform taking src points onto dst (least squares), None if degenerate."""
    m, _ = cv2.estimateAffinePartial2D(src.astype(np.float32), dst.astype(np.float32), method=cv2.LMEDS)
    return m


def _thumb(patch: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    grey = cv2.resize(cv2.cvtColor(patch, cv2.COLOR_RGB2GRAY), size, interpolation=cv2.INTER_AREA)
    g = grey.astype(np.float32).reshape(-1) / 255.0
    return g - g.mean()


def build_atlas(
    crops: np.ndarray,
    crop_landmarks: np.ndarray,
    usable: np.ndarray,
    geometry_rows: tuple[float, float, float, float],
    config: AtlasConfig | None = None,
) -> MouthAtlas:
    """Atlas from every usable frame's crop and crop-space landmarks.

    geometry_rows: (centre x, half width, nose row, chin row) of a typical frame, which sizes the box.
    """
    config = config or AtlasConfig()
    n = len(crops)
    size = crops.shape[1]
    ok = np.asarray(usable, bool).copy()
    template = np.median(crop_landmarks[ok][:, list(STABLE)], axis=0).astype(np.float32)
    cx, hw, nose, chin = geometry_rows
    x0, x1 = cx - 1.75 * hw, cx + 1.75 * hw
    y0, y1 = nose + 1.0, min(chin + 0.35 * hw, size - 1.0)
    origin = np.array([x0, y0], np.float32)
    box_w, box_h = int(round(x1 - x0)), int(round(y1 - y0))
    to_box = np.array([[1, 0, -x0], [0, 1, -y0]], np.float32)
    patches, descs, thumbs, sources = [], [], [], []
    for i in range(n):
        if not ok[i]:
            continue
        m = _similarity(crop_landmarks[i][list(STABLE)], template)
        if m is None:
            ok[i] = False
            continue
        # The mouth must lie inside the crop (a face cut by the frame edge stays out of the atlas).
        lips = crop_landmarks[i][list(INNER_LIP_RING) + [_LOWER_OUTER, *MOUTH_CORNERS]]
        if lips.min() < 1 or lips.max() > size - 2:
            ok[i] = False
            continue
        full = np.vstack([m, [0, 0, 1]])
        box = (np.vstack([to_box, [0, 0, 1]]) @ full)[:2]
        patch = cv2.warpAffine(
            crops[i], box, (box_w, box_h), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT
        )
        desc = describe(crop_landmarks[i], np.asarray(crops[i]))
        thumb = _thumb(patch, config.thumb)
        if descs:
            dist = np.abs(np.asarray(descs) - desc).sum(axis=1) + 0.5 * np.sqrt(
                np.mean((np.asarray(thumbs) - thumb) ** 2, axis=1)
            )
            if float(dist.min()) < config.dedupe:
                continue
        patches.append(patch)
        descs.append(desc)
        thumbs.append(thumb)
        sources.append(i)
        if len(patches) >= config.max_units:
            break
    if not patches:
        empty = np.zeros((0, max(box_h, 1), max(box_w, 1), 3), np.uint8)
        return MouthAtlas(
            empty,
            np.zeros((0, 5), np.float32),
            np.zeros((0, config.thumb[0] * config.thumb[1]), np.float32),
            np.zeros(0, np.int32),
            template,
            origin,
            0,
            n,
        )
    return MouthAtlas(
        np.stack(patches),
        np.asarray(descs, np.float32),
        np.asarray(thumbs, np.float32),
        np.asarray(sources, np.int32),
        template,
        origin,
        int(ok.sum()),
        n,
    )


def targets(atlas: MouthAtlas, features: np.ndarray) -> np.ndarray:
    """Target (aperture, width) per feature row, within the range this presenter was filmed in."""
    lo, hi = atlas.aperture_range
    w_lo, w_mid, w_hi = atlas.width_range
    f = np.atleast_2d(np.asarray(features, np.float32))  # any feature width: columns by name
    opening = np.clip(f[:, OPEN], 0, 1) * (1.0 - np.clip(f[:, CLOSURE], 0, 1))
    width = np.clip(f[:, WIDTH], -1, 1)
    # Rank mapping: an opening command c picks the aperture at quantile c of the filmed ones, so the
    # presenter's own range and its non-linear spread are used (no assumption on the tracker's scale).
    # (Linear from the closed to the widest filmed mouth re-tracked about as well but chose mouths further
    # from the filmed ones: mouth PSNR 17.1 vs 20.2 dB on the talking clip.)
    aperture = np.quantile(atlas.descriptors[:, APERTURE], np.clip(opening, 0.0, 1.0)).astype(np.float32)
    w = np.where(width >= 0, w_mid + width * (w_hi - w_mid), w_mid + width * (w_mid - w_lo))
    return np.stack([aperture, w], axis=1)


def target_costs(atlas: MouthAtlas, features: np.ndarray, config: AtlasConfig) -> np.ndarray:
    """[n, K] cost of each atlas mouth for each frame's articulation."""
    lo, hi = atlas.aperture_range
    w_lo, _, w_hi = atlas.width_range
    t = targets(atlas, features)
    da = (atlas.descriptors[None, :, APERTURE] - t[:, None, 0]) / max(hi - lo, 1e-3)
    dw = (atlas.descriptors[None, :, MOUTH_WIDTH] - t[:, None, 1]) / max(w_hi - w_lo, 1e-3)
    cost = da**2 + config.width_weight * dw**2
    f = np.atleast_2d(np.asarray(features, np.float32))
    if f.shape[1] > LABIODENTAL:
        # f/v (from phoneme timings): the lower lip against the upper teeth, so a mouth that shows them
        labio = np.clip(f[:, LABIODENTAL], 0.0, 1.0)
        cost = cost + config.teeth_weight * labio[:, None] * (1.0 - atlas.descriptors[None, :, TEETH]) ** 2
    return cost


def join_costs(atlas: MouthAtlas) -> np.ndarray:
    """[K, K] join distance of showing unit b right after unit a (thumbnail RMS × 8, median ~1 between
    two mouths); zero when b is a itself or follows it in the footage."""
    t = atlas.thumbs
    sq = (t * t).sum(axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * t @ t.T, 0.0) / t.shape[1]
    cost = np.sqrt(d2) * 8.0
    step = atlas.sources[None, :] - atlas.sources[:, None]
    cost[(step >= 0) & (step <= 2)] = 0.0  # the same mouth, or the next filmed frames
    return cost.astype(np.float32)


@dataclass(frozen=True)
class UnitChoice:
    """What one frame shows: `unit`, blended over `fade_from` (-1: none) with weight `alpha` on `unit`."""

    unit: int
    fade_from: int = -1
    fade_step: int = 0  # frames of the cross-fade shown, this one included (0: no fade)
    alpha: float = 1.0


def choose_units(
    atlas: MouthAtlas,
    target: np.ndarray,
    join: np.ndarray,
    speaking: np.ndarray,
    previous: UnitChoice | None,
    config: AtlasConfig,
) -> list[UnitChoice]:
    """Each row's mouth, causally: argmin target + join_weight × join from the mouth shown before.

    A change of mouth whose join distance exceeds `fade_above` while the opening stays within
    `fade_max_open` of the aperture range (a jump in look, not in shape) starts a cross-fade: `fade_frames`
    frames from the jump on blend the outgoing mouth with the new one (weight k/(fade_frames+1) on the new
    one in the k-th). A change of opening is cut, not faded: a blend of two openings is a double lip line
    that lags the sync. A silent row takes the best mouth for its target alone, without a fade, so the
    frames after a silence never depend on what came before it. `previous`: the last choice of the
    frames before (another batch).
    """
    lo, hi = atlas.aperture_range
    aperture = atlas.descriptors[:, APERTURE]
    max_step = config.fade_max_open * max(hi - lo, 1e-3)
    out: list[UnitChoice] = []
    prev = previous
    for row, talking in zip(target, speaking, strict=True):
        if not talking or prev is None:
            prev = UnitChoice(int(np.argmin(row)))
            out.append(prev)
            continue
        unit = int(np.argmin(row + config.join_weight * join[prev.unit]))
        fade_from, step = -1, 0
        if unit == prev.unit:
            if 0 < prev.fade_step < config.fade_frames:  # a fade goes on
                fade_from, step = prev.fade_from, prev.fade_step + 1
        elif (
            prev.fade_step == 0  # a jump during a fade is cut: chained fades kept two mouths on screen
            and join[prev.unit, unit] > config.fade_above
            and abs(aperture[unit] - aperture[prev.unit]) <= max_step
        ):
            if config.fade_frames > 0:  # a jump in look: fade in from the mouth shown (or being faded in)
                fade_from, step = prev.unit, 1
        alpha = step / (config.fade_frames + 1) if step else 1.0
        prev = UnitChoice(unit, fade_from, step, alpha)
        out.append(prev)
    return out


def unit_patch(atlas: MouthAtlas, choice: UnitChoice) -> np.ndarray:
    """The canonical mouth a choice shows: its unit, or the cross-fade of the outgoing one into it."""
    if choice.fade_from < 0 or choice.alpha >= 1.0:
        return atlas.patches[choice.unit]
    a = atlas.patches[choice.unit].astype(np.float32)
    b = atlas.patches[choice.fade_from].astype(np.float32)
    # Both patches are in canonical space (aligned by the stable points), so a pixel blend is a cross-fade.
    return np.clip(a * choice.alpha + b * (1.0 - choice.alpha) + 0.5, 0, 255).astype(np.uint8)


def judge(atlas: MouthAtlas, config: AtlasConfig | None = None) -> AtlasQuality:
    """Coverage: the share of target poses (11 openings × rounded/neutral/spread) with a mouth near them."""
    config = config or AtlasConfig()
    k = len(atlas.sources)
    if k < config.min_units:
        return AtlasQuality(k, 0.0, 0.0, False, f"only {k} distinct mouths (need {config.min_units})")
    lo, hi = atlas.aperture_range
    span = hi - lo
    grid = np.array([[o, w, 0.0] for o in np.linspace(0, 1, 11) for w in (-0.8, 0.0, 0.5)], np.float32)
    best = target_costs(atlas, grid, config).min(axis=1)
    coverage = float((best <= 0.1**2 + config.width_weight * 0.35**2).mean())
    if span < config.min_range:
        return AtlasQuality(
            k, coverage, span, False, f"the mouth barely moves in the footage (span {span:.3f})"
        )
    if coverage < config.min_coverage:
        return AtlasQuality(k, coverage, span, False, f"coverage {coverage:.2f} < {config.min_coverage}")
    return AtlasQuality(k, coverage, span, True, "")


def place_unit(
    atlas: MouthAtlas, unit: int, crop: np.ndarray, stable: np.ndarray, mask: np.ndarray
) -> np.ndarray:
    """The crop with atlas mouth `unit` placed by the frame's stable landmarks, colour-matched to it."""
    return place_patch(atlas, atlas.patches[unit], crop, stable, mask)


def place_patch(
    atlas: MouthAtlas, patch: np.ndarray, crop: np.ndarray, stable: np.ndarray, mask: np.ndarray
) -> np.ndarray:
    """The crop with a canonical mouth patch placed by the frame's stable landmarks, colour-matched."""
    size = crop.shape[0]
    m = _similarity(atlas.template, stable)
    if m is None:
        return crop.copy()
    # canonical -> crop, applied to patch pixels offset by the box origin.
    shift = np.array([[1, 0, atlas.origin[0]], [0, 1, atlas.origin[1]], [0, 0, 1]], np.float32)
    affine = (np.vstack([m, [0, 0, 1]]) @ shift)[:2].astype(np.float32)
    placed = cv2.warpAffine(
        patch, affine, (size, size), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
    )
    cover = cv2.warpAffine(
        np.full(patch.shape[:2], 255, np.uint8), affine, (size, size), flags=cv2.INTER_LINEAR, borderValue=0
    )
    weight = (mask.astype(np.float32) / 255.0) * (cover.astype(np.float32) / 255.0)
    # Colour and brightness: match the placed mouth to the base frame on the skin of the mask's feather.
    ring = (weight > 0.05) & (weight < 0.8)
    placed = placed.astype(np.float32)
    if int(ring.sum()) >= 20:
        base = crop[ring].astype(np.float32)
        src = placed[ring]
        gain = np.clip((base.std(axis=0) + 1.0) / (src.std(axis=0) + 1.0), 0.8, 1.25)
        placed = (placed - src.mean(axis=0)) * gain + base.mean(axis=0)
    # Outside the placed patch the crop shows through; the compositor's mouth mask does the final blend.
    # Only where the mouth mask is non-zero: the patch itself, not just the composite, keeps the rows at
    # and above the nose base untouched.
    c = ((cover.astype(np.float32) / 255.0) * (mask > 0))[..., None]
    out = placed * c + crop.astype(np.float32) * (1.0 - c)
    return np.clip(out + 0.5, 0, 255).astype(np.uint8)


def save_atlas(path: Path, atlas: MouthAtlas) -> int:
    """Write the atlas atomically (compressed); returns its size in bytes."""
    with atomic_file(path) as fh:
        np.savez_compressed(
            fh,
            version=ATLAS_VERSION,
            patches=atlas.patches,
            descriptors=atlas.descriptors,
            thumbs=atlas.thumbs.astype(np.float16),
            sources=atlas.sources,
            template=atlas.template,
            origin=atlas.origin,
            counts=np.array([atlas.frames_used, atlas.frames_total]),
        )
    return path.stat().st_size


def load_atlas(path: Path) -> MouthAtlas | None:
    """The atlas at path, or None if it is missing, unreadable or from another version."""
    try:
        with np.load(path) as z:
            if int(z["version"]) != ATLAS_VERSION:
                return None
            used, total = (int(v) for v in z["counts"])
            return MouthAtlas(
                z["patches"],
                z["descriptors"],
                z["thumbs"].astype(np.float32),
                z["sources"],
                z["template"],
                z["origin"],
                used,
                total,
            )
    except (OSError, KeyError, ValueError):
        return None

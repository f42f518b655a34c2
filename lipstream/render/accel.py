"""Where each frame's mouth patch comes from: silence, the codebook, the engine, or a cross-fade.

Speech is repetitive and articulators move at 5-10 Hz, so most 40 ms frames need no engine pass:
the keyframe planner picks keyframes by acoustic velocity, a SimHash codebook reuses patches of mouth
shapes already rendered, and frames between keyframes are cross-faded. The scheduler is
stream-friendly: push frames in time order, get back every frame whose patch is decided (infill
frames wait for their right-hand keyframe, at most `slow_stride` frames), then `finish()`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from lipstream.audio.levels import SilenceDetector
from lipstream.avatar.bundle import AvatarBundle
from lipstream.engines.base import Engine, Speech
from lipstream.render.codebook import SimHashCodebook, hamming
from lipstream.render.infill import CrossFader
from lipstream.render.planner import INFILL, KEYFRAME, SILENT, KeyframePlanner, PlannerConfig
from lipstream.render.timing import StageTimer

log = logging.getLogger(__name__)

# Low-dimensional features (the viseme engine's 3 articulation values) lose their magnitude under a
# plain SimHash, which only sees direction. Appending a constant coordinate hashes the point itself
# (the sign of a·f + b), so "half open" and "wide open" land far apart. LIFT_GAIN sets how far: with
# 4.0, a change of about 0.025 in a feature in [0, 1] flips about 2 of 64 bits. Gain and hit threshold
# (1 bit for these features, see AccelConfig) were chosen on benchmarks/scenarios/accel.py's seed clip.
LOW_DIM = 16
LIFT_GAIN = 4.0


class AccelConfig(BaseModel):
    """Acceleration settings. `enabled=False` (the CLI's --no-accel) renders every frame with the engine;
    None (the default) follows the engine's `accelerate_by_default`."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool | None = None
    planner: PlannerConfig = Field(default_factory=PlannerConfig)
    codebook: bool = True
    codebook_threshold: int | None = Field(
        None, ge=0, le=16,
        description="max Hamming distance of a hit; None: 2 for rich features (MuseTalk's Whisper windows), "
        "1 for low-dimensional ones (the viseme engine's 3 values), whose 64 bits are largely redundant",
    )
    codebook_entries: int = Field(
        512, ge=1, description="bound; the least recently used entry is evicted (a 256² patch is 192 kB)"
    )
    codebook_bits: int = Field(64, ge=8, le=64)
    seed: int = 0


def resolve_accel(config: AccelConfig | None, engine: Engine) -> AccelConfig:
    """The settings with `enabled` decided: the user's choice, else the engine's default."""
    config = config or AccelConfig()
    if config.enabled is not None:
        return config
    return config.model_copy(update={"enabled": bool(engine.accelerate_by_default)})


@dataclass
class AccelStats:
    """Counts for reports: where the frames' patches came from."""

    frames: int = 0
    silent_frames: int = 0
    keyframes: int = 0
    codebook_hits: int = 0
    neural_frames: int = 0
    infill_frames: int = 0

    def as_dict(self) -> dict[str, int]:
        """JSON-friendly view."""
        return dict(self.__dict__)


def speaking_mask(silent: np.ndarray, margin_frames: int = 2) -> np.ndarray:
    """Frames that get a patch: not silent, widened by a margin so onsets and releases animate."""
    speaking = ~np.asarray(silent, dtype=bool)
    if margin_frames <= 0 or speaking.size == 0:
        return speaking
    idx = np.flatnonzero(speaking)
    widened = np.zeros_like(speaking)
    for d in range(-margin_frames, margin_frames + 1):
        shifted = idx + d
        widened[shifted[(shifted >= 0) & (shifted < speaking.size)]] = True
    return widened


@dataclass
class UtteranceFrames:
    """What the scheduler needs for a whole utterance, frame by frame."""

    features: np.ndarray  # [n, D] float32
    silent: np.ndarray  # [n] bool: the audio is silent there
    skip: np.ndarray  # [n] bool: frames left to the idle presenter (none without acceleration)
    base_ids: np.ndarray  # [n] int64: source frame shown under each frame (the idle loop from tick 0)


def utterance_frames(
    bundle: AvatarBundle, engine: Engine, speech: Speech, accel: AccelConfig, silence: SilenceDetector
) -> UtteranceFrames:
    """Features, silence and base frames of a whole utterance; `accel` must be resolved."""
    n = speech.frame_count
    features = np.asarray(engine.features(speech), dtype=np.float32)
    if features.shape[0] < n:
        raise RuntimeError(f"engine {engine.name} returned {features.shape[0]} feature rows for {n} frames")
    silent = silence.silent_mask(speech.pcm)[:n]
    # without acceleration every frame, silent or not, goes through the engine
    skip = ~speaking_mask(silent) if accel.enabled else np.zeros(n, dtype=bool)
    return UtteranceFrames(features[:n], silent, skip, bundle.base_frame_indices(0, n))


def hash_vectors(features: np.ndarray) -> np.ndarray:
    """The vectors the codebook hashes: low-dimensional features are lifted so magnitude counts."""
    feats = np.asarray(features, dtype=np.float32).reshape(len(features), -1)
    if feats.shape[1] >= LOW_DIM:
        return feats
    ones = np.ones((len(feats), 1), dtype=np.float32)
    return np.concatenate([feats * LIFT_GAIN, ones], axis=1)


def codebook_path(bundle: AvatarBundle, engine: Engine) -> Path:
    """Where an avatar keeps the codebook of one engine (and engine variant)."""
    variant = engine.cache_key
    name = f"codebook-{variant}.npz" if variant else "codebook.npz"
    return bundle.engine_dir(engine.name) / name


def hit_threshold(engine: Engine, config: AccelConfig) -> int:
    """The codebook's Hamming threshold for this engine's feature kind (see AccelConfig)."""
    if config.codebook_threshold is not None:
        return config.codebook_threshold
    return 2 if engine.feature_dim >= LOW_DIM else 1


def hash_dim(engine: Engine) -> int:
    """Length of the vectors `hash_vectors` makes from this engine's features."""
    return engine.feature_dim if engine.feature_dim >= LOW_DIM else engine.feature_dim + 1


def new_codebook(engine: Engine, config: AccelConfig) -> SimHashCodebook:
    """An empty codebook for this engine's feature kind."""
    dim = hash_dim(engine)
    # lifted low-dim vectors are already centred by construction; high-dim ones use a running mean
    mean = np.zeros(dim, np.float32) if engine.feature_dim < LOW_DIM else None
    return SimHashCodebook(
        dim, bits=config.codebook_bits, seed=config.seed, max_entries=config.codebook_entries,
        threshold=hit_threshold(engine, config), mean=mean,
    )


def load_codebook(bundle: AvatarBundle, engine: Engine, config: AccelConfig) -> SimHashCodebook:
    """The avatar's persisted codebook for this engine, or a new one (also when settings changed)."""
    path = codebook_path(bundle, engine)
    if path.is_file():
        book = SimHashCodebook.load(path)
        if book.dim == hash_dim(engine) and book.bits == config.codebook_bits and book.seed == config.seed:
            book.threshold = hit_threshold(engine, config)
            return book
        log.warning("codebook %s was made with other settings; starting a new one", path)
    return new_codebook(engine, config)


def save_codebook(book: SimHashCodebook, bundle: AvatarBundle, engine: Engine) -> Path:
    """Persist the codebook in the bundle (atomic write) and record it in the manifest."""
    path = codebook_path(bundle, engine)
    path.parent.mkdir(parents=True, exist_ok=True)
    book.save(path)
    entry = dict(bundle.manifest.engines.get(engine.name, {}))
    entry["codebook"] = {"file": str(path.relative_to(bundle.path)), "entries": book.size}
    bundle.update_engine_entry(engine.name, entry)
    return path


@dataclass
class _Pending:
    """A frame pushed but not yet released."""

    features: np.ndarray
    base_id: int
    payload: Any


class PatchScheduler:
    """Decides and produces each frame's patch, in time order, with as few engine passes as it can."""

    def __init__(
        self,
        bundle: AvatarBundle,
        engine: Engine,
        config: AccelConfig | None = None,
        codebook: SimHashCodebook | None = None,
        timer: StageTimer | None = None,
    ) -> None:
        self.bundle = bundle
        self.engine = engine
        self.config = resolve_accel(config, engine)
        self.timer = timer or StageTimer()
        self.stats = AccelStats()
        self.codebook = codebook if (self.config.enabled and self.config.codebook) else None
        if self.codebook is None and self.config.enabled and self.config.codebook:
            self.codebook = new_codebook(engine, self.config)
        self.planner = KeyframePlanner(self.config.planner)
        self._pending: dict[int, _Pending] = {}
        self._keys: dict[int, np.ndarray] = {}  # keyframe patches not yet released, plus the latest
        self._next = 0
        self._fader = CrossFader((engine.patch_size, engine.patch_size, 3))

    def push(
        self, features: np.ndarray, silent: np.ndarray, base_ids: np.ndarray, payloads: list | None = None
    ) -> list[tuple[Any, np.ndarray | None]]:
        """Add frames; return (payload, patch or None for silence) for every frame now decided, in order."""
        n = len(base_ids)
        payloads = payloads if payloads is not None else [None] * n
        if n == 0:
            return []
        feats = np.asarray(features, dtype=np.float32).reshape(n, -1)
        silent = np.asarray(silent, dtype=bool).reshape(n)
        start = self._next
        for i in range(n):
            self._pending[start + i] = _Pending(feats[i], int(base_ids[i]), payloads[i])
        self._next += n
        if not self.config.enabled:
            return self._render_all(range(start, start + n))
        with self.timer.stage("planner"):
            plan = self.planner.plan(feats, silent)
        return self._release(plan)

    @property
    def pending(self) -> int:
        """Frames pushed but not yet released (waiting for their right-hand keyframe)."""
        return len(self._pending)

    def finish(self) -> list[tuple[Any, np.ndarray | None]]:
        """End of the utterance: release every held-back frame; the planner starts afresh."""
        if not self.config.enabled:
            return []
        plan = self.planner.finish()
        out = self._release(plan)
        self.reset()
        return out

    def reset(self) -> None:
        """Drop everything held back (an interrupt); the calibrated threshold and codebook stay."""
        self.planner = KeyframePlanner(self.planner.config)
        self._pending.clear()
        self._keys.clear()
        self._next = 0

    def _render_all(self, indices) -> list[tuple[Any, np.ndarray | None]]:
        """--no-accel: every frame gets an engine pass."""
        idx = list(indices)
        patches = self._render([self._pending[i] for i in idx])
        out = [(self._pending.pop(i).payload, p) for i, p in zip(idx, patches, strict=True)]
        self.stats.frames += len(idx)
        self.stats.keyframes += len(idx)
        return out

    def _render(self, frames: list[_Pending]) -> list[np.ndarray]:
        patches: list[np.ndarray] = []
        step = max(1, int(self.engine.batch_size))
        for start in range(0, len(frames), step):
            chunk = frames[start : start + step]
            with self.timer.stage("engine"):
                rendered = self.engine.render(
                    self.bundle,
                    np.stack([f.features for f in chunk]),
                    np.array([f.base_id for f in chunk], dtype=np.int64),
                )
            patches.extend(np.asarray(p) for p in rendered)
            self.stats.neural_frames += len(chunk)
        return patches

    def _keyframe_patches(self, indices: list[int]) -> None:
        """Fill self._keys for these keyframes: codebook hits first (also against earlier misses of the
        same batch, so a long push reuses its own shapes), the rest in engine batches."""
        misses: list[int] = []
        aliases: dict[int, int] = {}  # keyframe -> the earlier miss of this batch whose patch it reuses
        codes: dict[int, np.uint64] = {}
        if self.codebook is not None and indices:
            with self.timer.stage("codebook"):
                vectors = hash_vectors(np.stack([self._pending[i].features for i in indices]))
                hashed = self.codebook.hash(vectors)
                miss_codes: list[np.uint64] = []
                for i, code in zip(indices, hashed, strict=True):
                    codes[i] = code
                    found = self.codebook.lookup(code)
                    if found.patch is not None:
                        self._remember(i, found.patch.copy())
                        self.stats.codebook_hits += 1
                        continue
                    if miss_codes:
                        near = hamming(np.array(miss_codes, dtype=np.uint64), code)
                        j = int(np.argmin(near))
                        if int(near[j]) <= self.codebook.threshold:
                            aliases[i] = misses[j]
                            self.stats.codebook_hits += 1
                            continue
                    misses.append(i)
                    miss_codes.append(code)
        else:
            misses = list(indices)
        rendered = self._render([self._pending[i] for i in misses])
        for i, patch in zip(misses, rendered, strict=True):
            self._remember(i, patch)
            if self.codebook is not None:
                self.codebook.insert(codes[i], patch)
        for i, source in aliases.items():
            self._remember(i, self._keys[source])

    def _remember(self, index: int, patch: np.ndarray) -> None:
        self._keys[index] = patch

    def _release(self, plan) -> list[tuple[Any, np.ndarray | None]]:
        keys = [int(i) for i, k in zip(plan.index, plan.kind, strict=True) if k == KEYFRAME]
        self.stats.keyframes += len(keys)
        self._keyframe_patches(keys)
        out: list[tuple[Any, np.ndarray | None]] = []
        for index, kind, left, right, weight in zip(
            plan.index, plan.kind, plan.left, plan.right, plan.weight, strict=True
        ):
            frame = self._pending.pop(int(index))
            self.stats.frames += 1
            if kind == SILENT:
                self.stats.silent_frames += 1
                out.append((frame.payload, None))
            elif kind == KEYFRAME:
                out.append((frame.payload, self._keys[int(index)]))
            elif kind == INFILL:
                self.stats.infill_frames += 1
                with self.timer.stage("infill"):
                    patch = np.empty_like(self._keys[int(left)])
                    self._fader.blend(self._keys[int(left)], self._keys[int(right)], float(weight), patch)
                out.append((frame.payload, patch))
        if self._keys:  # only the latest keyframe can be the left neighbour of frames still to come
            latest = max(self._keys)
            self._keys = {latest: self._keys[latest]}
        return out

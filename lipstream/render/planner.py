"""Which frames need a neural pass: silence gating and adaptive keyframes from acoustic velocity."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

log = logging.getLogger(__name__)

SILENT = 0  # no neural pass; the idle presenter's own mouth is shown
KEYFRAME = 1  # rendered by the engine (or reused from the codebook)
INFILL = 2  # blended from the keyframes on either side


class PlannerConfig(BaseModel):
    """Keyframe schedule settings.

    Articulators move at 5-10 Hz, so a 40 ms frame rarely differs much from its neighbours: during fast
    change (plosives, onsets; acoustic velocity at or above the threshold) a keyframe is taken every
    `fast_stride` frames, otherwise every `slow_stride` frames. The threshold depends on the feature kind
    (its scale differs per engine), so it is calibrated: `calibrate(features)` sets it to the
    `calibration_quantile` of that feature stream's velocities.
    """

    model_config = ConfigDict(extra="forbid")

    fast_stride: int = Field(2, ge=1, description="frames between keyframes where velocity is high")
    slow_stride: int = Field(4, ge=1, le=8, description="frames between keyframes where velocity is low")
    velocity_threshold: float | None = Field(
        None, ge=0, description="velocity at or above which change is 'fast'; None: calibrate on the stream"
    )
    calibration_quantile: float = Field(0.7, gt=0, lt=1, description="share of voiced frames counted slow")
    min_calibration_frames: int = Field(
        25, ge=2, description="voiced frames a chunk needs before it is used to calibrate automatically"
    )

    @model_validator(mode="after")
    def _strides_ordered(self) -> PlannerConfig:
        """fast_stride must not exceed slow_stride."""
        if self.fast_stride > self.slow_stride:
            raise ValueError("fast_stride must be <= slow_stride")
        return self


@dataclass(frozen=True)
class Plan:
    """Final decisions for a run of frames (global indices), as parallel arrays.

    For INFILL frames, `left`/`right` are the keyframes on either side and `weight` the cross-fade
    position in (0, 1); for KEYFRAME and SILENT frames left = right = index and weight = 0.
    """

    index: np.ndarray  # int64 [N]
    kind: np.ndarray  # int8 [N]: SILENT, KEYFRAME or INFILL
    left: np.ndarray  # int64 [N]
    right: np.ndarray  # int64 [N]
    weight: np.ndarray  # float32 [N]

    def __len__(self) -> int:
        return int(self.index.size)

    @staticmethod
    def concat(plans: list[Plan]) -> Plan:
        """Join consecutive plans into one."""
        fields = ("index", "kind", "left", "right", "weight")
        if not plans:
            return _empty_plan()
        return Plan(*(np.concatenate([getattr(p, f) for p in plans]) for f in fields))


def _empty_plan() -> Plan:
    """A plan with no frames."""
    empty = np.zeros(0, dtype=np.int64)
    return Plan(empty, np.zeros(0, np.int8), empty, empty, np.zeros(0, np.float32))


def acoustic_velocity(features: np.ndarray, previous: np.ndarray | None = None) -> np.ndarray:
    """Mean absolute change of each frame's feature vector from the one before ([T]; inf if none)."""
    feats = np.asarray(features, dtype=np.float32).reshape(len(features), -1)
    velocity = np.empty(len(feats), dtype=np.float32)
    if len(feats) == 0:
        return velocity
    velocity[0] = np.inf if previous is None else float(np.mean(np.abs(feats[0] - previous.reshape(-1))))
    if len(feats) > 1:
        velocity[1:] = np.mean(np.abs(np.diff(feats, axis=0)), axis=1)
    return velocity


class KeyframePlanner:
    """Stream-capable keyframe planner: push feature chunks with their silent masks, get final decisions.

    Every voiced run starts and ends on a keyframe (so infill always has two neighbours), and no gap
    between keyframes exceeds slow_stride. A frame's decision is final once the next keyframe (or
    silence) is known, so `plan` holds back at most slow_stride frames; `finish` releases the rest.
    """

    def __init__(self, config: PlannerConfig | None = None) -> None:
        """Start a fresh stream with the given settings."""
        self.config = (config or PlannerConfig()).model_copy()
        self._next_index = 0
        self._previous: np.ndarray | None = None  # last frame's features (for velocity across chunks)
        self._last_key: int | None = None  # last keyframe of the current voiced run
        self._max_velocity = 0.0  # highest velocity since the last keyframe
        self._pending: list[int] = []  # voiced frames after the last keyframe, not yet decided
        self._pending_silent_after = False

    def calibrate(self, features: np.ndarray, silent: np.ndarray | None = None) -> float:
        """Set the velocity threshold to the configured quantile of these features' voiced velocities."""
        velocity = acoustic_velocity(features)[1:]
        if silent is not None:
            mask = np.asarray(silent, dtype=bool)
            velocity = velocity[~(mask[1:] | mask[:-1])]
        velocity = velocity[np.isfinite(velocity)]
        if velocity.size == 0:
            raise ValueError("calibration needs at least two consecutive voiced frames")
        self.config.velocity_threshold = float(np.quantile(velocity, self.config.calibration_quantile))
        return self.config.velocity_threshold

    def plan(self, features: np.ndarray, silent: np.ndarray) -> Plan:
        """Add the next frames (features [T, D], silent mask [T]); return the decisions that became final."""
        feats = np.asarray(features, dtype=np.float32)
        feats = feats.reshape(len(feats), -1) if feats.size else np.zeros((len(feats), 1), np.float32)
        mask = np.asarray(silent, dtype=bool).reshape(-1)
        if len(mask) != len(feats):
            raise ValueError(f"silent mask has {len(mask)} frames, features {len(feats)}")
        # Without a threshold every voiced frame counts as slow until a chunk long enough to calibrate on.
        if self.config.velocity_threshold is None and (~mask).sum() >= self.config.min_calibration_frames:
            log.info(
                "keyframe planner: no velocity threshold set, calibrating on a %d-frame chunk", len(feats)
            )
            try:
                self.calibrate(feats, mask)
            except ValueError:
                pass  # voiced frames all isolated between silences: wait for a later chunk
        velocity = acoustic_velocity(feats, self._previous)
        out = _PlanBuilder()
        threshold = self.config.velocity_threshold
        for i in range(len(feats)):
            index = self._next_index + i
            if mask[i]:
                self._close_run(out)
                out.add(index, SILENT, index, index, 0.0)
                continue
            if self._last_key is None:  # onset of a voiced run
                self._take_key(index, out)
                continue
            self._max_velocity = max(self._max_velocity, float(velocity[i]))
            self._pending.append(index)
            gap = index - self._last_key
            fast = threshold is not None and self._max_velocity >= threshold
            if gap >= (self.config.fast_stride if fast else self.config.slow_stride):
                self._pending.pop()
                self._take_key(index, out)
        self._next_index += len(feats)
        if len(feats):
            self._previous = feats[-1].copy()
        return out.build()

    def finish(self) -> Plan:
        """End of stream: the last voiced frame becomes a keyframe; return every remaining decision."""
        out = _PlanBuilder()
        self._close_run(out)
        self._previous = None
        return out.build()

    def _take_key(self, index: int, out: _PlanBuilder) -> None:
        """Make index a keyframe and resolve the held-back infill frames before it."""
        if self._pending and self._last_key is not None:
            left, span = self._last_key, index - self._last_key
            for frame in self._pending:
                out.add(frame, INFILL, left, index, (frame - left) / span)
        self._pending.clear()
        out.add(index, KEYFRAME, index, index, 0.0)
        self._last_key = index
        self._max_velocity = 0.0

    def _close_run(self, out: _PlanBuilder) -> None:
        """Silence (or the end) follows: the run's last voiced frame becomes a keyframe."""
        if self._pending:
            last = self._pending.pop()
            self._take_key(last, out)
        self._last_key = None
        self._max_velocity = 0.0


class _PlanBuilder:
    """Collects decisions in order and packs them into a Plan."""

    def __init__(self) -> None:
        self.rows: list[tuple[int, int, int, int, float]] = []

    def add(self, index: int, kind: int, left: int, right: int, weight: float) -> None:
        self.rows.append((index, kind, left, right, weight))

    def build(self) -> Plan:
        if not self.rows:
            return _empty_plan()
        rows = sorted(self.rows)
        index, kind, left, right, weight = zip(*rows, strict=True)
        return Plan(
            np.array(index, np.int64),
            np.array(kind, np.int8),
            np.array(left, np.int64),
            np.array(right, np.int64),
            np.array(weight, np.float32),
        )

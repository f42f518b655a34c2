"""Which stretch of the footage the idle presenter plays: the calmest, with the mouth at rest.

The idle loop is shown whenever the avatar listens, and under every spoken frame (only the mouth is
redrawn), so it should look like someone waiting: mouth closed, head nearly still. A long clip of a talking
presenter has such stretches between phrases; ping-ponging the whole clip would instead replay every word
with the mouth mid-syllable. The rest of the footage still feeds the mouth atlas.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lipstream.avatar.face_measures import EYE_CORNERS, lip_aperture

# FaceMesh points that move with the head but not with speech or expression (nose bridge, eye corners,
# forehead, cheekbones): their frame-to-frame travel is the head's motion.
HEAD_POINTS = (1, 4, 6, 9, 10, 33, 133, 151, 168, 197, 263, 362, 234, 454)


@dataclass(frozen=True)
class IdleConfig:
    """How long the idle stretch is and how calm beats closed."""

    max_seconds: float = 6.0  # the stretch plays forward then back: a 12 s cycle before it repeats
    rest_aperture: float = 0.08  # inner-lip gap (eye-corner distances) that counts as one unit of "open"
    rest_motion: float = 0.004  # head travel per frame (eye-corner distances) that counts as one unit
    end_frames: int = 4  # the frames at each end (where the loop turns) count this many times over
    # a stretch starting on a GOP boundary of footage.mp4 (every `align_frames`) shares its forward GOPs
    # with it (copied, not encoded again: issue 37); taken when it is within `align_slack` of the calmest
    align_frames: int = 25
    align_slack: float = 0.05


@dataclass(frozen=True)
class IdleStretch:
    """Frames start..stop-1 of the footage, played forward then back."""

    start: int
    stop: int
    mouth_open: float  # mean inner-lip gap over the stretch, eye-corner distances
    motion: float  # mean head travel per frame over the stretch, eye-corner distances
    reason: str

    def loop(self) -> np.ndarray:
        """Frame order of the idle presenter: forward, then back without showing an end frame twice."""
        forward = np.arange(self.start, self.stop, dtype=np.int32)
        return np.concatenate([forward, forward[-2:0:-1]]) if len(forward) > 2 else forward

    def entry(self, fps: int) -> dict:
        """What manifest.json records under `idle`."""
        return {
            "start": self.start, "stop": self.stop, "seconds": round((self.stop - self.start) / fps, 2),
            "mouth_open": round(self.mouth_open, 4), "motion": round(self.motion, 5), "reason": self.reason,
        }  # fmt: skip


def frame_costs(landmarks: np.ndarray, tracked: np.ndarray, config: IdleConfig) -> tuple[np.ndarray, ...]:
    """Per frame: (cost, inner-lip gap, head travel); untracked frames cost infinity."""
    n = len(landmarks)
    aperture = np.array([lip_aperture(lm) for lm in landmarks], dtype=np.float64)
    eyes = np.linalg.norm(landmarks[:, EYE_CORNERS[0]] - landmarks[:, EYE_CORNERS[1]], axis=1)
    head = landmarks[:, list(HEAD_POINTS)].astype(np.float64)
    motion = np.zeros(n)
    if n > 1:
        travel = np.linalg.norm(np.diff(head, axis=0), axis=2).mean(axis=1) / np.maximum(eyes[1:], 1e-6)
        motion[1:] = travel
        motion[0] = travel[0]
    cost = aperture / config.rest_aperture + motion / config.rest_motion
    cost[~np.asarray(tracked, bool)] = np.inf
    return cost, aperture, motion


def choose_idle_stretch(landmarks: np.ndarray, tracked: np.ndarray, fps: int, config: IdleConfig | None = None
                        ) -> IdleStretch:  # fmt: skip
    """The calmest window of up to max_seconds with the mouth most at rest (the whole clip if shorter)."""
    config = config or IdleConfig()
    n = len(landmarks)
    length = max(1, min(n, int(round(config.max_seconds * fps))))
    cost, aperture, motion = frame_costs(landmarks, tracked, config)
    if length == n:
        start = 0
        reason = f"the whole clip ({n / fps:.1f} s, not longer than {config.max_seconds:g} s)"
    else:
        weight = np.ones(length)
        ends = min(config.end_frames, length // 2)
        weight[:ends] = weight[-ends:] = config.end_frames  # where the loop turns, stillness matters most
        finite = np.where(np.isfinite(cost), cost, 1e9)
        scores = np.convolve(finite, weight[::-1], mode="valid") / weight.sum()
        start = int(np.argmin(scores))
        if config.align_frames > 1:
            aligned = np.arange(0, len(scores), config.align_frames)
            best_aligned = int(aligned[np.argmin(scores[aligned])])
            if scores[best_aligned] <= scores[start] * (1.0 + config.align_slack) + 1e-9:
                start = best_aligned
        reason = (
            f"the calmest {length / fps:.1f} s of {n / fps:.1f} s with the mouth most at rest "
            f"(frames {start}-{start + length - 1})"
        )
    stop = start + length
    return IdleStretch(
        start, stop, float(aperture[start:stop].mean()), float(motion[start:stop].mean()), reason
    )

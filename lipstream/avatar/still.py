"""A photo becomes a short idle clip: the person breathes and leans a little, and blinks, over a still
background. Its frames are made here, once, at prepare time; from then on the avatar is a clip like any other
(its landmarks are the photo's, moved exactly as the person was)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lipstream.avatar.blink import BlinkConfig, IdleBlinks, close_eyes, count_blinks, plan_closure, rng_for
from lipstream.avatar.breathing import (
    BreathingConfig,
    clean_plate,
    move_points,
    moved_picture,
    person_matte,
    pivot,
    poses,
)

if TYPE_CHECKING:
    from lipstream.avatar.face_client import FaceModels


@dataclass(frozen=True)
class StillClip:
    """The frames of a breathing, blinking photo: frame 0 is the photo itself."""

    photo: np.ndarray
    matte: np.ndarray
    plate: np.ndarray
    affines: np.ndarray  # [frames, 2, 3] photo -> frame
    landmarks: np.ndarray  # [frames, points, 2] the photo's landmarks, moved
    closure: np.ndarray  # [frames] lid closure drawn on each frame
    blink: BlinkConfig
    fps: int

    @classmethod
    def make(
        cls, photo: np.ndarray, landmarks: np.ndarray, blink: BlinkConfig, breathing: BreathingConfig,
        fps: int, name: str, models: FaceModels | None = None,
    ) -> StillClip:  # fmt: skip
        """Plan the clip of a photo whose face has `landmarks` (the avatar's name seeds its blinks); `models`:
        face models already open (the tracker's), else the segmentation opens its own."""
        frames = int(round(blink.photo_loop_s * fps))
        matte = person_matte(photo, breathing, models)
        plate = clean_plate(photo, matte, breathing)
        affines = poses(frames, pivot(matte), breathing)
        moved = np.stack([move_points(landmarks, a) for a in affines])
        closure = np.zeros(frames, np.float32)
        if blink.enabled:
            closure = plan_closure(frames, fps, blink, rng_for(name), lead=blink.interval_s[0] / 2)
        return cls(photo, matte, plate, affines, moved, closure, blink, fps)

    @property
    def frames(self) -> int:
        """Frames in one pass of the loop."""
        return len(self.affines)

    def picture(self, k: int) -> np.ndarray:
        """Frame k: the person moved, then the lids drawn."""
        rgb = moved_picture(self.photo, self.matte, self.plate, self.affines[k])
        amount = float(self.closure[k])
        return close_eyes(rgb, self.landmarks[k], amount, self.blink) if amount > 0 else rgb

    def blinks(self) -> IdleBlinks:
        """The loop (every frame once, in order: the motion wraps without a jump) and its blinks."""
        loop = np.arange(self.frames, dtype=np.int32)
        seconds, drawn = self.frames / self.fps, count_blinks(self.closure)
        return IdleBlinks(loop, self.closure, 0, drawn, seconds, drawing=self.blink.enabled)

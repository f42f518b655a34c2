"""What the render path emits: one video frame on the audio clock, with its own audio slice."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class AvatarFrame:
    """One 40 ms frame: pts in audio samples (16 kHz), the picture, and the audio it covers."""

    index: int  # frame number on the session's timeline
    pts: int  # samples at 16 kHz since the start of the timeline
    base_index: int  # source frame of the avatar shown (head position)
    audio: np.ndarray  # int16 mono slice, SAMPLES_PER_FRAME long
    image: np.ndarray | None = None  # H×W×3 uint8 RGB when not encoded
    i420: np.ndarray | None = None  # I420 [(H*3/2), W] uint8 from an I420Frames sink (WebRTC's own format)
    access_unit: bytes | None = None  # H.264 Annex-B access unit when encoded
    keyframe: bool = False  # the access unit is an IDR
    speaking: bool = False  # frame belongs to an utterance (False: idle presenter)
    end_of_speech: bool = False  # last frame of an utterance
    utterance_id: int | None = None
    loop_index: int = 0  # position in the avatar's base loop (idle_loop) of this frame
    lids: float = 0.0  # lid closure of a blink decided while speaking (0: the loop's own eyes)
    blink_starts: bool = False  # such a blink begins on this frame (a patch-stream client draws it)

"""The audio master clock: 16 kHz mono; video frame k covers samples [k*640, (k+1)*640)."""

from __future__ import annotations

SAMPLE_RATE = 16_000
FPS = 25
SAMPLES_PER_FRAME = SAMPLE_RATE // FPS  # 640 samples = 40 ms


def frame_count(n_samples: int) -> int:
    """Number of whole video frames covered by n_samples of audio: floor(seconds * fps)."""
    return max(0, n_samples) // SAMPLES_PER_FRAME


def frame_pts(frame_index: int) -> int:
    """Presentation time of a frame, in audio samples at SAMPLE_RATE."""
    return frame_index * SAMPLES_PER_FRAME


def frame_slice(frame_index: int) -> slice:
    """The audio samples that a frame covers."""
    start = frame_index * SAMPLES_PER_FRAME
    return slice(start, start + SAMPLES_PER_FRAME)

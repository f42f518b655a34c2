"""Loudness per 40 ms video frame, and the decision of which frames are silent."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lipstream.audio.timeline import SAMPLES_PER_FRAME, frame_count

# Floor for the dBFS of digital silence, so log10(0) never happens and silence has a finite level.
SILENCE_FLOOR_DBFS = -120.0

# Default silence threshold. Speech from our TTS voices sits at -30..-10 dBFS per frame and
# room-tone in ordinary recordings at -70..-55 dBFS; -45 dBFS lies between with margin on both sides.
DEFAULT_SILENCE_DBFS = -45.0


def frame_rms(pcm16k: np.ndarray) -> np.ndarray:
    """RMS level of each whole 40 ms frame of 16 kHz float PCM, in dBFS (full-scale sine = -3 dBFS)."""
    pcm = np.asarray(pcm16k, dtype=np.float32).reshape(-1)
    n = frame_count(pcm.size)
    if n == 0:
        return np.zeros(0, dtype=np.float32)
    frames = pcm[: n * SAMPLES_PER_FRAME].reshape(n, SAMPLES_PER_FRAME).astype(np.float64)
    rms = np.sqrt(np.mean(frames * frames, axis=1))
    db = 20.0 * np.log10(np.maximum(rms, 10 ** (SILENCE_FLOOR_DBFS / 20.0)))
    return db.astype(np.float32)


@dataclass(frozen=True)
class SilenceDetector:
    """Marks frames silent when their RMS is below threshold_dbfs.

    Short voiced gaps inside words (stop closures, ~30-80 ms) would otherwise flicker the mouth shut,
    so a silent run must last at least min_silent_frames to count; shorter runs are kept as speech.
    """

    threshold_dbfs: float = DEFAULT_SILENCE_DBFS
    min_silent_frames: int = 3

    def silent_mask(self, pcm16k: np.ndarray) -> np.ndarray:
        """Boolean mask [frame_count(len(pcm))]: True where the frame is silent."""
        return self.mask_from_levels(frame_rms(pcm16k))

    def mask_from_levels(self, levels_dbfs: np.ndarray) -> np.ndarray:
        """Apply the threshold and the minimum-run rule to per-frame levels in dBFS."""
        quiet = np.asarray(levels_dbfs) < self.threshold_dbfs
        if self.min_silent_frames <= 1 or quiet.size == 0:
            return quiet
        mask = quiet.copy()
        # Find runs of quiet frames and clear those shorter than the minimum.
        edges = np.diff(np.concatenate([[0], quiet.astype(np.int8), [0]]))
        starts = np.flatnonzero(edges == 1)
        ends = np.flatnonzero(edges == -1)
        for start, end in zip(starts, ends, strict=True):
            if end - start < self.min_silent_frames:
                mask[start:end] = False
        return mask

    def is_silent(self, pcm16k: np.ndarray) -> bool:
        """True when every whole frame of the buffer is below the threshold (or there is no whole frame)."""
        levels = frame_rms(pcm16k)
        return bool(np.all(levels < self.threshold_dbfs))

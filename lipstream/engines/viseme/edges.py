"""Where an utterance meets the footage: the lips ease between the presenter's own mouth and speech.

Between utterances a live session shows the footage as filmed, whose mouth may be anything (the sample
smiles with its teeth showing); inside one, silence closes the lips. Switching in one 40 ms frame pops, so
the first rows of an utterance that starts from the footage ease the closure in, and a few frames after it
ends carry its last row back to the footage's own mouth."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lipstream.engines.viseme.articulation import CLOSURE


@dataclass(frozen=True)
class EdgeConfig:
    """How many frames the lips take to leave the footage's mouth, and to return to it."""

    frames: int = 3  # 120 ms: about as long as lips take to close or part


def ease_onset(feats: np.ndarray, first_row: int, config: EdgeConfig) -> np.ndarray:
    """Rows of an utterance from its row `first_row` on, their closure eased in over the first frames.

    Only the closure ramps: an opening is drawn relative to the footage's mouth, so it needs no easing."""
    out = np.array(feats, dtype=np.float32, copy=True)
    rows = first_row + np.arange(len(out))
    out[:, CLOSURE] *= np.minimum((rows + 1) / (config.frames + 1.0), 1.0)
    return out


def release_rows(last_row: np.ndarray, config: EdgeConfig) -> np.ndarray:
    """Rows for the frames after an utterance: its last row fading to the footage's own mouth (all zeros)."""
    steps = 1.0 - np.arange(1, config.frames + 1, dtype=np.float32) / (config.frames + 1.0)
    return np.asarray(last_row, dtype=np.float32)[None, :] * steps[:, None]

"""The Engine interface shared by the viseme and MuseTalk engines (Speech lives in audio.speech)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import numpy as np

# Re-exported: engines and older callers import the speech data from here.
from lipstream.audio.speech import PhonemeTiming, Speech
from lipstream.avatar.bundle import AvatarBundle

__all__ = [
    "BatchesAcrossSessions",
    "DescribesMouth",
    "Engine",
    "FeatureStream",
    "PhonemeTiming",
    "ReportsStatus",
    "Speech",
]


class FeatureStream(Protocol):
    """Incremental features for a growing audio buffer (live sessions)."""

    def push(self, pcm: np.ndarray) -> np.ndarray:
        """Add 16 kHz float32 PCM; return features [k, D] for frames that became final."""

    def finish(self) -> np.ndarray:
        """End of utterance: return the features of every remaining frame."""


@runtime_checkable
class Engine(Protocol):
    """A lip-sync engine. Planner, compositor and server do not know which one runs.

    - `features(speech)` -> float32 [speech.frame_count, feature_dim], one row per 40 ms frame.
    - `render(bundle, features, frame_ids)` -> uint8 RGB patches [B, patch_size, patch_size, 3] in crop
      space (the frame's box resized to patch_size²), pure and batched; frame_ids are source frame
      indices of the bundle (the base frame each patch will be pasted on).

    Five optional hooks (`stack_inputs`, `for_session`, `withdraw`, `onset`, `release`) and `cache_key` have
    defaults here: an engine that subclasses Engine inherits them and overrides only the ones it needs
    (VisemeEngine eases utterance edges; BatchedEngine binds a session's view, which withdraws its queued
    passes on an interrupt). Powers only some engines have are Protocols of their own below
    (`BatchesAcrossSessions`, `ReportsStatus`, `DescribesMouth`), asked for with isinstance, never hasattr.
    """

    name: str
    feature_kind: str
    feature_dim: int
    patch_size: int
    batch_size: int
    lookahead_frames: int  # features of frame k need audio up to frame k + lookahead_frames
    accelerate_by_default: bool  # keyframes/codebook/infill on unless the user says otherwise
    cache_key: str = ""  # what its per-avatar caches depend on besides its name (a variant; "": none)

    def prepare(self, bundle: AvatarBundle) -> None:
        """Build (or check) this engine's caches for an avatar; idempotent."""

    def features(self, speech: Speech) -> np.ndarray:
        """Per-frame audio features for a whole utterance."""

    def stream_features(self) -> FeatureStream:
        """A fresh incremental feature extractor for one live utterance."""

    def render(self, bundle: AvatarBundle, features: np.ndarray, frame_ids: np.ndarray) -> np.ndarray:
        """Mouth patches for the given features, one per frame id."""

    # ---- optional hooks, with the defaults of an engine that needs none

    @staticmethod
    def stack_inputs(parts: list[Any]) -> Any:
        """One pass's inputs from several sessions' (a batcher's); default: numpy concatenation."""
        return np.concatenate(parts)

    def for_session(self, deadline: Callable[[], float]) -> Engine:
        """The engine one session renders with, its renders due at `deadline()` (perf_counter s); default:
        this engine itself (an engine shared through a batcher returns the session's own view)."""
        return self

    def withdraw(self) -> int:
        """Drop the calling session's queued work (an interrupt); the frames withdrawn (default: none)."""
        return 0

    def onset(self, feats: np.ndarray, first_row: int) -> np.ndarray:
        """An utterance's rows from `first_row` on, for one that starts from the footage's own mouth;
        default: as they are (no easing in)."""
        return feats

    def release(self, last_row: np.ndarray) -> np.ndarray:
        """Rows for the idle frames after an utterance, back from its last row to the footage's own mouth;
        default: none (the footage's mouth at once)."""
        return np.zeros((0, *np.shape(last_row)), np.float32)


# ---- optional powers: an engine (or its wrapper) that has one declares it; callers ask with isinstance


@runtime_checkable
class BatchesAcrossSessions(Protocol):
    """An engine whose render splits into its pass inputs, one fixed-size pass and the patches' finishing,
    so one batcher can run several sessions' frames in a pass (MuseTalkEngine; see engines/batched.py)."""

    def pass_inputs(
        self, bundle: AvatarBundle, features: np.ndarray, frame_ids: np.ndarray
    ) -> tuple[Any, Any]:
        """One render's pass inputs (latents, audio), one row per frame id; `stack_inputs` joins several."""

    def pass_runner(self, size: int) -> Callable[[Any, Any], np.ndarray]:
        """The pass at one fixed batch `size` (built and warmed on first use): inputs -> patches."""

    def finish_patches(self, bundle: AvatarBundle, frame_ids: np.ndarray, out: np.ndarray) -> np.ndarray:
        """A pass's raw patches as this avatar's crops."""


@runtime_checkable
class ReportsStatus(Protocol):
    """Something serving that reports its own figures for /healthz (the batched engine: sizes, passes)."""

    def status(self) -> dict[str, Any]:
        """JSON-ready figures."""


@runtime_checkable
class DescribesMouth(Protocol):
    """An engine that can say which mouth it draws an avatar with (the weight-free one: filmed or drawn)."""

    def mouth_source(self, bundle: AvatarBundle) -> str:
        """One line for reports: which mouth, and why."""

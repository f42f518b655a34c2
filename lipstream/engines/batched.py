"""A neural engine shared by many sessions through one EngineBatcher (the server's default for MuseTalk).

`BatchedEngine` wraps an engine that can split a render into its pass inputs, a fixed-size pass and the
patches' finishing (it declares `BatchesAcrossSessions`: MuseTalkEngine). Each session gets its own view
(`for_session(deadline)`): its renders are queued with the deadline of the frame it is making, and an
interrupt withdraws what it had queued. Both declare `Engine`; everything else (features, prepare, sizes) is
the wrapped engine's own, forwarded member by member by `_Forwarding`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from lipstream.avatar.bundle import AvatarBundle
from lipstream.engines.base import BatchesAcrossSessions, Engine, FeatureStream, ReportsStatus, Speech
from lipstream.engines.batcher import BatchConfig, BatchObserver, EngineBatcher, Withdrawn

__all__ = ["BatchableEngine", "BatchedEngine", "SessionEngine", "Withdrawn"]


class BatchableEngine(Engine, BatchesAcrossSessions, Protocol):
    """What `BatchedEngine` wraps: an Engine with the power to batch across sessions."""


class _Forwarding(Engine):
    """The Engine's members as the wrapped engine (`self.engine`) has them; the wrappers override render
    and the session hooks. Written out, not looked up by name, so the contract is the wrapper's own."""

    engine: BatchableEngine

    @property
    def name(self) -> str:
        """The wrapped engine's name (caches and codebooks are keyed by it)."""
        return self.engine.name

    @property
    def feature_kind(self) -> str:
        """The wrapped engine's audio feature kind."""
        return self.engine.feature_kind

    @property
    def feature_dim(self) -> int:
        """Width of one frame's feature row."""
        return self.engine.feature_dim

    @property
    def patch_size(self) -> int:
        """Side of a rendered patch (pixels)."""
        return self.engine.patch_size

    @property
    def batch_size(self) -> int:
        """The wrapped engine's own fixed batch (the frames a session renders at once)."""
        return self.engine.batch_size

    @property
    def lookahead_frames(self) -> int:
        """Frames of audio a feature row needs beyond its own."""
        return self.engine.lookahead_frames

    @property
    def accelerate_by_default(self) -> bool:
        """Whether keyframes, codebook and infill are on unless the user says otherwise."""
        return self.engine.accelerate_by_default

    @property
    def cache_key(self) -> str:
        """What the wrapped engine's per-avatar caches depend on besides its name."""
        return self.engine.cache_key

    def prepare(self, bundle: AvatarBundle) -> None:
        """The wrapped engine's caches for an avatar."""
        self.engine.prepare(bundle)

    def features(self, speech: Speech) -> np.ndarray:
        """The wrapped engine's per-frame features."""
        return self.engine.features(speech)

    def stream_features(self) -> FeatureStream:
        """The wrapped engine's incremental feature extractor."""
        return self.engine.stream_features()

    def stack_inputs(self, parts: list[Any]) -> Any:
        """The wrapped engine's joining of several sessions' pass inputs."""
        return self.engine.stack_inputs(parts)

    def onset(self, feats: np.ndarray, first_row: int) -> np.ndarray:
        """The wrapped engine's easing in."""
        return self.engine.onset(feats, first_row)

    def release(self, last_row: np.ndarray) -> np.ndarray:
        """The wrapped engine's easing out."""
        return self.engine.release(last_row)


class BatchedEngine(_Forwarding, ReportsStatus):
    """The engine plus its batcher; every fixed batch size is built and warmed here, before any session."""

    def __init__(
        self,
        engine: BatchableEngine,
        config: BatchConfig | None = None,
        observer: BatchObserver | None = None,
    ) -> None:
        if not isinstance(engine, BatchesAcrossSessions):
            raise TypeError(f"the {engine.name} engine cannot batch across sessions")
        self.engine = engine
        self.config = config or BatchConfig()
        started = time.perf_counter()
        for size in self.config.batch_sizes:  # compiled graphs and warm kernels for every shape, now
            engine.pass_runner(size)
        self.warmup_seconds = time.perf_counter() - started
        stack = engine.stack_inputs
        # the pass runners pad a short pass themselves (fixed shapes): nothing to pad here
        self.batcher = EngineBatcher(
            engine.pass_runner, self.config, stack=stack, pad=lambda x, _size: x, observer=observer,
            name=engine.name,
        )  # fmt: skip

    def for_session(self, deadline: Callable[[], float]) -> SessionEngine:
        """One session's view: its renders go through the batcher, due at `deadline()` (perf_counter s)."""
        return SessionEngine(self, deadline)

    def render(self, bundle: AvatarBundle, features: np.ndarray, frame_ids: np.ndarray) -> np.ndarray:
        """A render outside any session (warm-up, offline): through the batcher, due now."""
        return SessionEngine(self, time.perf_counter).render(bundle, features, frame_ids)

    def status(self) -> dict[str, Any]:
        """The batch sizes, warm-up time and pass figures (/healthz)."""
        return {
            "batch_sizes": list(self.config.batch_sizes), "max_batch_wait_ms": self.config.max_wait_ms,
            "warmup_seconds": round(self.warmup_seconds, 3), "queued_frames": self.batcher.queued_frames,
            **self.batcher.stats.as_dict(),
        }  # fmt: skip

    def close(self) -> None:
        """Stop the batcher's worker."""
        self.batcher.close()


class SessionEngine(_Forwarding):
    """The engine as one session sees it: renders queued with its deadline, withdrawn on an interrupt."""

    def __init__(self, parent: BatchedEngine, deadline: Callable[[], float]) -> None:
        self.parent = parent
        self.engine = parent.engine
        self.deadline = deadline
        self.owner = parent.batcher.new_owner()

    def render(self, bundle: AvatarBundle, features: np.ndarray, frame_ids: np.ndarray) -> np.ndarray:
        """Mouth patches, from passes shared with the other sessions (Withdrawn after an interrupt)."""
        engine = self.engine
        latents, audio = engine.pass_inputs(bundle, features, frame_ids)
        if len(latents) == 0:
            return engine.finish_patches(bundle, frame_ids, np.zeros((0, *self._patch_shape()), np.uint8))
        out = self.parent.batcher.run(self.owner, latents, audio, self.deadline())
        return engine.finish_patches(bundle, frame_ids, out)

    def for_session(self, deadline: Callable[[], float]) -> SessionEngine:
        """Already one session's view: itself (its renders keep their own deadline)."""
        return self

    def _patch_shape(self) -> tuple[int, int, int]:
        size = int(self.engine.patch_size)
        return size, size, 3

    def withdraw(self) -> int:
        """Drop this session's queued passes (an interrupt, or the session closing); frames withdrawn."""
        return self.parent.batcher.withdraw(self.owner)

"""A neural engine shared by many sessions through one EngineBatcher (the server's default for MuseTalk).

`BatchedEngine` wraps an engine that can split a render into its pass inputs, a fixed-size pass and the
patches' finishing (MuseTalkEngine: `pass_inputs`, `pass_runner`, `finish_patches`). Each session gets its
own view (`for_session(deadline)`): its renders are queued with the deadline of the frame it is making, and
an interrupt withdraws what it had queued. Everything else (features, prepare, sizes) is the engine's own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from lipstream.avatar.bundle import AvatarBundle
from lipstream.engines.batcher import BatchConfig, BatchObserver, EngineBatcher, Withdrawn

__all__ = ["BatchedEngine", "SessionEngine", "Withdrawn", "supports_batching"]


def supports_batching(engine: Any) -> bool:
    """The engine can hand its passes to a batcher."""
    return all(hasattr(engine, name) for name in ("pass_inputs", "pass_runner", "finish_patches"))


class BatchedEngine:
    """The engine plus its batcher; every fixed batch size is built and warmed here, before any session."""

    def __init__(self, engine: Any, config: BatchConfig | None = None, observer: BatchObserver | None = None):
        if not supports_batching(engine):
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

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)  # name, feature_dim, features(), prepare() ...

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


class SessionEngine:
    """The engine as one session sees it: renders queued with its deadline, withdrawn on an interrupt."""

    def __init__(self, parent: BatchedEngine, deadline: Callable[[], float]) -> None:
        self.parent = parent
        self.deadline = deadline
        self.owner = parent.batcher.new_owner()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.parent.engine, name)

    def render(self, bundle: AvatarBundle, features: np.ndarray, frame_ids: np.ndarray) -> np.ndarray:
        """Mouth patches, from passes shared with the other sessions (Withdrawn after an interrupt)."""
        engine = self.parent.engine
        latents, audio = engine.pass_inputs(bundle, features, frame_ids)
        if len(latents) == 0:
            return engine.finish_patches(bundle, frame_ids, np.zeros((0, *self._patch_shape()), np.uint8))
        out = self.parent.batcher.run(self.owner, latents, audio, self.deadline())
        return engine.finish_patches(bundle, frame_ids, out)

    def for_session(self, deadline: Callable[[], float]) -> SessionEngine:
        """Already one session's view: itself (its renders keep their own deadline)."""
        return self

    def _patch_shape(self) -> tuple[int, int, int]:
        size = int(self.parent.engine.patch_size)
        return size, size, 3

    def withdraw(self) -> int:
        """Drop this session's queued passes (an interrupt, or the session closing); frames withdrawn."""
        return self.parent.batcher.withdraw(self.owner)

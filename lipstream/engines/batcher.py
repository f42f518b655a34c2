"""Cross-session batching of neural engine passes: one batcher per engine (per GPU), shared by the sessions.

Sessions submit the inputs of their keyframes (a job: n frames' latents and audio windows) with a deadline,
the wall time their playback reaches the first of those frames. A worker thread runs the engine on fixed
batch sizes only (so compiled graphs and CUDA graphs stay valid), filling each pass earliest deadline first,
with a per-session share so a session with a long backlog cannot starve the others, and hands each session
its patches. A session that is interrupted withdraws its pending jobs. A pass that finishes after a job's
deadline counts that job's frames as late: they are still delivered (the session decides what to show).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from pydantic import BaseModel, Field, field_validator

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZES = (4, 8, 16, 32)


class BatchConfig(BaseModel):
    """The batcher's fixed batch sizes and how long a pass may wait for more work."""

    batch_sizes: tuple[int, ...] = DEFAULT_BATCH_SIZES
    # a pass waits at most this long after its first job for others to join it, unless it is full or the
    # most urgent job's deadline leaves no more time than two passes and a margin
    max_wait_ms: float = Field(40.0, ge=0, le=1000)
    urgency_margin_ms: float = Field(20.0, ge=0, le=1000)

    @field_validator("batch_sizes")
    @classmethod
    def _sizes(cls, sizes: tuple[int, ...]) -> tuple[int, ...]:
        if not sizes or any(int(s) < 1 for s in sizes):
            raise ValueError("batch sizes must be positive integers")
        return tuple(sorted({int(s) for s in sizes}))

    @property
    def largest(self) -> int:
        """The biggest pass."""
        return self.batch_sizes[-1]

    def fitting(self, frames: int) -> int:
        """The smallest batch size that holds `frames`."""
        return next(size for size in self.batch_sizes if size >= frames)


class PassRunner(Protocol):
    """Runs one engine pass on stacked inputs whose length is one of the batch sizes."""

    def __call__(self, latents: Any, audio: Any) -> np.ndarray:
        """[size, ...] inputs -> [size, ...] outputs (uint8 patches)."""


class BatchObserver(Protocol):
    """Where the batcher reports each pass (the server's metrics)."""

    def engine_pass(self, sessions: int, frames: int, size: int, seconds: float, late_frames: int) -> None:
        """One pass ran."""

    def engine_queue(self, frames: int) -> None:
        """Frames waiting for a pass now."""


class Withdrawn(Exception):
    """The job was withdrawn (its session was interrupted or closed) before a pass took it."""


@dataclass(eq=False)
class _Job:
    owner: int
    latents: Any  # [n, ...] tensors (or arrays) the pass runner stacks
    audio: Any
    deadline: float  # perf_counter seconds
    done: Future = field(default_factory=Future)
    submitted: float = field(default_factory=time.perf_counter)
    order: int = 0  # submission order: ties in deadline go first come, first served

    @property
    def frames(self) -> int:
        return len(self.latents)


@dataclass
class BatchStats:
    """What the batcher has done (for /healthz and the benchmarks)."""

    passes: int = 0
    frames: int = 0
    padded_frames: int = 0  # slots a pass ran with no job in them
    session_slots: int = 0  # sum over passes of the sessions in each pass
    late_frames: int = 0
    withdrawn_frames: int = 0
    pass_seconds: float = 0.0
    sizes: dict[int, int] = field(default_factory=dict)  # passes per batch size

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready figures, with the means."""
        return {
            "passes": self.passes, "frames": self.frames, "padded_frames": self.padded_frames,
            "late_frames": self.late_frames, "withdrawn_frames": self.withdrawn_frames,
            "sessions_per_pass": round(self.session_slots / self.passes, 3) if self.passes else None,
            "frames_per_pass": round(self.frames / self.passes, 3) if self.passes else None,
            "pass_ms": round(1000 * self.pass_seconds / self.passes, 2) if self.passes else None,
            "passes_by_size": dict(sorted(self.sizes.items())),
        }  # fmt: skip


class EngineBatcher:
    """Pools the engine passes of many sessions (thread-safe; one worker thread runs the passes).

    `run_pass(size)` returns the runner for a batch size; `stack(parts)` joins the jobs' inputs and
    `pad(x, size)` repeats the last row up to `size` (defaults: numpy; the MuseTalk engine gives torch's).
    """

    def __init__(
        self,
        run_pass: Callable[[int], PassRunner],
        config: BatchConfig | None = None,
        *,
        stack: Callable[[Sequence[Any]], Any] = np.concatenate,
        pad: Callable[[Any, int], Any] | None = None,
        observer: BatchObserver | None = None,
        name: str = "engine",
    ) -> None:
        self.config = config or BatchConfig()
        self._run_pass = run_pass
        self._stack = stack
        self._pad = pad or _pad_numpy
        self.observer = observer
        self.stats = BatchStats()
        self._jobs: list[_Job] = []
        self._cond = threading.Condition()
        self._closed = False
        self._order = itertools.count()
        self._owners = itertools.count(1)
        self._thread = threading.Thread(target=self._loop, name=f"lipstream-batch-{name}", daemon=True)
        self._thread.start()

    def new_owner(self) -> int:
        """A key for one session's jobs."""
        return next(self._owners)

    @property
    def queued_frames(self) -> int:
        """Frames submitted and not yet taken by a pass."""
        with self._cond:
            return sum(job.frames for job in self._jobs)

    def submit(self, owner: int, latents: Any, audio: Any, deadline: float) -> list[Future]:
        """Queue n frames for `owner`, due at `deadline` (perf_counter seconds); one future per pass-sized
        piece (a job larger than the largest batch is split), each giving that piece's outputs."""
        if self._closed:
            raise RuntimeError("the engine batcher is closed")
        futures = []
        step = self.config.largest
        with self._cond:
            for start in range(0, len(latents), step):
                job = _Job(owner, latents[start : start + step], audio[start : start + step], deadline,
                           order=next(self._order))  # fmt: skip
                self._jobs.append(job)
                futures.append(job.done)
            self._cond.notify_all()
            queued = sum(job.frames for job in self._jobs)
        if self.observer is not None:
            self.observer.engine_queue(queued)
        return futures

    def run(self, owner: int, latents: Any, audio: Any, deadline: float) -> np.ndarray:
        """Submit and wait: the outputs of these frames, in order (Withdrawn if withdrawn meanwhile)."""
        return np.concatenate([f.result() for f in self.submit(owner, latents, audio, deadline)])

    def withdraw(self, owner: int) -> int:
        """Drop `owner`'s jobs not yet taken by a pass (an interrupt); their waiters get Withdrawn. Returns
        the frames withdrawn."""
        with self._cond:
            mine = [job for job in self._jobs if job.owner == owner]
            self._jobs = [job for job in self._jobs if job.owner != owner]
            frames = sum(job.frames for job in mine)
            self.stats.withdrawn_frames += frames
        for job in mine:
            job.done.set_exception(Withdrawn(f"withdrawn: {job.frames} frames"))
        return frames

    def close(self) -> None:
        """Stop the worker; pending jobs are withdrawn."""
        with self._cond:
            self._closed = True
            jobs, self._jobs = self._jobs, []
            self._cond.notify_all()
        for job in jobs:
            job.done.set_exception(Withdrawn("the engine batcher closed"))
        self._thread.join(timeout=10)

    # ---- the worker -------------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            if batch is None:
                return
            try:
                self._run(batch)
            except Exception as exc:  # noqa: BLE001 - the waiting sessions get the error, the worker goes on
                log.exception("engine pass failed")
                for job in batch:
                    if not job.done.done():
                        job.done.set_exception(exc)

    def _next_batch(self) -> list[_Job] | None:
        """Wait for work, give late-comers up to max_wait_ms to join, then take one pass's jobs."""
        wait = self.config.max_wait_ms / 1000.0
        with self._cond:
            while not self._jobs and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            first = min(job.submitted for job in self._jobs)
            while not self._closed:
                queued = sum(job.frames for job in self._jobs)
                now = time.perf_counter()
                # a full pass, or the oldest job has waited long enough, or a deadline leaves no time
                slack = min(job.deadline for job in self._jobs) - now
                urgent = slack <= 2 * self._expected_pass_seconds() + self.config.urgency_margin_ms / 1000
                if queued >= self.config.largest or now - first >= wait or urgent:
                    break
                self._cond.wait(timeout=max(0.0005, first + wait - now))
            if self._closed:
                return None
            batch = self._choose(self._jobs)
            chosen = {id(job) for job in batch}
            self._jobs = [job for job in self._jobs if id(job) not in chosen]
            return batch

    def _expected_pass_seconds(self) -> float:
        return self.stats.pass_seconds / self.stats.passes if self.stats.passes else 0.0

    def _choose(self, jobs: list[_Job]) -> list[_Job]:
        """Earliest deadline first, each session up to its share of the largest pass first (a session with a
        long backlog cannot crowd out the others), then whatever still fits, in the same order."""
        capacity = self.config.largest
        ordered = sorted(jobs, key=lambda job: (job.deadline, job.order))
        owners = {job.owner for job in ordered}
        share = max(1, capacity // len(owners))
        taken: dict[int, int] = {}
        batch: list[_Job] = []
        used = 0
        for job in ordered:  # shares: every session's most urgent jobs, up to its share
            mine = taken.get(job.owner, 0)
            first_of_owner = mine == 0
            if used + job.frames <= capacity and (first_of_owner or mine + job.frames <= share):
                batch.append(job)
                taken[job.owner] = mine + job.frames
                used += job.frames
        chosen = {id(job) for job in batch}
        for job in ordered:  # room left: the rest, most urgent first
            if id(job) not in chosen and used + job.frames <= capacity:
                batch.append(job)
                used += job.frames
        return sorted(batch, key=lambda job: (job.deadline, job.order))

    def _run(self, batch: list[_Job]) -> None:
        frames = sum(job.frames for job in batch)
        size = self.config.fitting(frames)
        latents = self._pad(self._stack([job.latents for job in batch]), size)
        audio = self._pad(self._stack([job.audio for job in batch]), size)
        started = time.perf_counter()
        out = self._run_pass(size)(latents, audio)
        finished = time.perf_counter()
        late = 0
        at = 0
        for job in batch:
            job.done.set_result(out[at : at + job.frames])
            at += job.frames
            if finished > job.deadline:
                late += job.frames
        stats = self.stats
        stats.passes += 1
        stats.frames += frames
        stats.padded_frames += size - frames
        stats.session_slots += len({job.owner for job in batch})
        stats.late_frames += late
        stats.pass_seconds += finished - started
        stats.sizes[size] = stats.sizes.get(size, 0) + 1
        if self.observer is not None:
            self.observer.engine_pass(len({j.owner for j in batch}), frames, size, finished - started, late)
            self.observer.engine_queue(self.queued_frames)


def _pad_numpy(x: Any, size: int) -> Any:
    """Repeat the last row up to `size` rows (a fixed shape for the pass)."""
    if len(x) >= size:
        return x
    return np.concatenate([x, np.repeat(x[-1:], size - len(x), axis=0)])

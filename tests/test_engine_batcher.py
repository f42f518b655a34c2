"""The cross-session engine batcher (issue 25): fixed shapes, earliest deadline first, a fair share per pass,
withdrawal on interrupt, late passes counted; and the MuseTalk engine batched across sessions giving the
same patches as its own per-session path (tiny checkpoints of the real topology, CPU)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from lipstream.engines.batcher import BatchConfig, EngineBatcher, Withdrawn


class RecordingPass:
    """A pass that doubles its input and records each pass's shape and rows (what ran, in what order)."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.seconds = seconds
        self.shapes: list[int] = []
        self.rows: list[list[float]] = []
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, size: int):
        def run(latents: np.ndarray, audio: np.ndarray) -> np.ndarray:
            self.gate.wait(10)
            assert len(latents) == size == len(audio)
            self.shapes.append(size)
            self.rows.append([float(x) for x in latents[:, 0]])
            time.sleep(self.seconds)
            return latents * 2

        return run


def rows(values: list[float]) -> np.ndarray:
    return np.array(values, np.float32)[:, None]


def test_passes_run_only_at_the_fixed_sizes_and_every_job_gets_its_own_rows() -> None:
    recorder = RecordingPass()
    batcher = EngineBatcher(recorder, BatchConfig(batch_sizes=(4, 8), max_wait_ms=20))
    try:
        owners = [batcher.new_owner() for _ in range(3)]
        with ThreadPoolExecutor(3) as pool:
            futures = [
                pool.submit(
                    batcher.run,
                    owner,
                    rows([o * 10 + i for i in range(n)]),
                    rows([0] * n),
                    time.perf_counter(),
                )
                for o, (owner, n) in enumerate(zip(owners, (3, 2, 5), strict=True))
            ]
            results = [f.result(10) for f in futures]
        for o, (out, n) in enumerate(zip(results, (3, 2, 5), strict=True)):
            assert out[:, 0].tolist() == [2.0 * (o * 10 + i) for i in range(n)]
        assert set(recorder.shapes) <= {4, 8}
        assert batcher.stats.frames == 10 and batcher.stats.padded_frames == sum(recorder.shapes) - 10
        # a job larger than the largest pass is split across passes, still in order
        big = batcher.run(owners[0], rows(list(range(11))), rows([0] * 11), time.perf_counter())
        assert big[:, 0].tolist() == [2.0 * i for i in range(11)]
    finally:
        batcher.close()


def _queue_while_blocked(
    batcher: EngineBatcher, recorder: RecordingPass, jobs: list[tuple[int, list[float], float]]
):
    """Hold the worker in a first pass, queue `jobs` (owner, rows, deadline), release it; the futures."""
    recorder.gate.clear()
    blocker = batcher.submit(batcher.new_owner(), rows([-1.0]), rows([0.0]), time.perf_counter())
    time.sleep(0.1)  # the worker is inside the blocked pass
    futures = [
        batcher.submit(owner, rows(values), rows([0.0] * len(values)), deadline)
        for owner, values, deadline in jobs
    ]
    recorder.gate.set()
    for f in blocker + [f for fs in futures for f in fs]:
        f.result(10)
    return futures


def test_earliest_deadline_first() -> None:
    recorder = RecordingPass()
    batcher = EngineBatcher(recorder, BatchConfig(batch_sizes=(2,), max_wait_ms=0))
    try:
        now = time.perf_counter()
        a, b, c = (batcher.new_owner() for _ in range(3))
        _queue_while_blocked(
            batcher, recorder, [(a, [1, 1], now + 3), (b, [2, 2], now + 1), (c, [3, 3], now + 2)]
        )
        assert recorder.rows[1:] == [[2, 2], [3, 3], [1, 1]]
    finally:
        batcher.close()


def test_a_session_with_a_backlog_does_not_starve_the_others() -> None:
    """One session queues 8 jobs due first; two others one each, due later: the first pass (size 8) still
    carries the two others, each session within its share."""
    recorder = RecordingPass()
    batcher = EngineBatcher(recorder, BatchConfig(batch_sizes=(8,), max_wait_ms=0))
    try:
        now = time.perf_counter()
        flood, b, c = (batcher.new_owner() for _ in range(3))
        jobs = [(flood, [1, 1], now + 0.1 * i) for i in range(8)] + [
            (b, [2, 2], now + 5),
            (c, [3, 3], now + 6),
        ]
        _queue_while_blocked(batcher, recorder, jobs)
        first = recorder.rows[1]
        assert first.count(2) == 2 and first.count(3) == 2, first
        assert first.count(1) == 4  # the flooding session's share of the pass: 8 // 3 rounded to its jobs
    finally:
        batcher.close()


def test_an_interrupt_withdraws_queued_work_and_its_waiter_is_told() -> None:
    recorder = RecordingPass()
    batcher = EngineBatcher(recorder, BatchConfig(batch_sizes=(4,), max_wait_ms=0))
    try:
        recorder.gate.clear()
        blocker = batcher.submit(batcher.new_owner(), rows([-1]), rows([0]), time.perf_counter())
        time.sleep(0.1)
        gone, kept = batcher.new_owner(), batcher.new_owner()
        withdrawn = batcher.submit(gone, rows([1, 1, 1]), rows([0, 0, 0]), time.perf_counter())
        other = batcher.submit(kept, rows([2]), rows([0]), time.perf_counter())
        assert batcher.withdraw(gone) == 3
        recorder.gate.set()
        with pytest.raises(Withdrawn):
            withdrawn[0].result(10)
        assert other[0].result(10)[:, 0].tolist() == [4.0]
        blocker[0].result(10)
        assert all(1.0 not in r for r in recorder.rows), recorder.rows
        assert batcher.stats.withdrawn_frames == 3
    finally:
        batcher.close()


def test_a_pass_that_ends_after_a_deadline_counts_late_frames_and_still_delivers() -> None:
    recorder = RecordingPass(seconds=0.05)
    batcher = EngineBatcher(recorder, BatchConfig(batch_sizes=(4,), max_wait_ms=0))
    try:
        out = batcher.run(batcher.new_owner(), rows([1, 2]), rows([0, 0]), time.perf_counter() - 1)
        assert out[:, 0].tolist() == [2, 4]
        assert batcher.stats.late_frames == 2
        batcher.run(batcher.new_owner(), rows([1]), rows([0]), time.perf_counter() + 10)
        assert batcher.stats.late_frames == 2
    finally:
        batcher.close()


def test_batch_config_is_checked() -> None:
    assert BatchConfig(batch_sizes=(16, 4, 8, 4)).batch_sizes == (4, 8, 16)
    with pytest.raises(ValueError):
        BatchConfig(batch_sizes=(0, 4))
    assert BatchConfig(batch_sizes=(4, 8)).fitting(5) == 8


# ---- the real engine, batched --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory: pytest.TempPathFactory):
    from lipstream.engines.musetalk.topology import write_model_folder
    from lipstream.engines.registry import create_engine

    models = write_model_folder(tmp_path_factory.mktemp("tiny") / "models", versions=("1.5",), tiny=True)
    return create_engine("musetalk", models_dir=str(models), device="cpu", dtype="float32", batch_size=4)


@pytest.mark.slow
def test_musetalk_batched_across_sessions_matches_its_own_passes(tiny_engine, small_avatar) -> None:
    from lipstream.audio.speech import Speech
    from lipstream.engines.batched import BatchedEngine

    tiny_engine.prepare(small_avatar)
    t = np.arange(16000) / 16000
    features = tiny_engine.features(
        Speech((0.3 * np.sin(2 * np.pi * 200 * t) * np.sin(6 * t)).astype(np.float32))
    )
    frame_ids = small_avatar.base_frame_indices(0, 6)
    expected = tiny_engine.render(small_avatar, features[:6], frame_ids)
    batched = BatchedEngine(tiny_engine, BatchConfig(batch_sizes=(4, 8, 16), max_wait_ms=30))
    try:
        sessions = [batched.for_session(time.perf_counter) for _ in range(3)]
        with ThreadPoolExecutor(3) as pool:
            outs = list(pool.map(lambda s: s.render(small_avatar, features[:6], frame_ids), sessions))
        for out in outs:
            assert out.shape == expected.shape and out.dtype == np.uint8
            assert np.abs(out.astype(int) - expected.astype(int)).max() <= 1
        stats = batched.status()
        assert stats["frames"] == 18 and set(stats["passes_by_size"]) <= {4, 8, 16}
        assert stats["sessions_per_pass"] > 1, stats  # the three sessions shared passes
        assert batched.name == "musetalk" and batched.feature_dim == tiny_engine.feature_dim
    finally:
        batched.close()


@pytest.mark.slow  # 7-17 s of real-time sessions
def test_session_interrupt_withdraws_its_batched_work(tiny_engine, small_avatar) -> None:
    """A live Session on the batched engine: speaking works, and an interrupt leaves no frame of the old
    speech and no error."""
    import asyncio

    from lipstream.engines.batched import BatchedEngine
    from lipstream.render.frames import AvatarFrame
    from lipstream.render.session import RenderSession, SessionConfig

    batched = BatchedEngine(tiny_engine, BatchConfig(batch_sizes=(4, 8), max_wait_ms=5))
    t = np.arange(32000) / 16000
    pcm = (0.3 * np.sin(2 * np.pi * 200 * t) * np.sin(6 * t)).astype(np.float32)

    async def run() -> tuple[int, int]:
        speech_frames, after = 0, 0
        async with RenderSession(small_avatar, batched, SessionConfig(encode=False)) as session:
            session.push_audio(pcm)
            session.flush()
            cut = None
            async for item in session:
                if isinstance(item, AvatarFrame) and item.speaking:
                    speech_frames += 1
                    if speech_frames == 10:
                        cut = session.interrupt()
                    elif cut is not None and item.pts >= cut:
                        after += 1
                if isinstance(item, AvatarFrame) and cut is not None and item.pts > cut + 25 * 640:
                    break
        return speech_frames, after

    try:
        speech_frames, after = asyncio.run(run())
        assert speech_frames >= 10 and after == 0
    finally:
        batched.close()


def test_a_server_with_the_batched_engine_reports_its_shapes(tiny_engine) -> None:
    from lipstream.engines.batched import BatchedEngine

    batched = BatchedEngine(tiny_engine, BatchConfig(batch_sizes=(4, 8), max_wait_ms=5))
    try:
        status = batched.status()
        assert status["batch_sizes"] == [4, 8] and status["warmup_seconds"] >= 0
    finally:
        batched.close()

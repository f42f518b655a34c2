"""Tests that hold a real-time budget run alone; the heaviest modules are scheduled first.

Under pytest-xdist (`make test` runs two workers), a test marked `realtime` (a turn decided within its
silence, an interrupt within 300 ms, a replica replaced in time) takes an exclusive lock for its whole run
(setup, call, teardown), and every other test a shared one: while it runs, the other workers finish the test
they are in and wait, so its clock is measured on an otherwise quiet machine, as in one process. A turnstile
lock keeps a waiting `realtime` test from being starved by the others' back-to-back shared locks. In one
process (no xdist) nothing is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

# The modules that take longest (docs/testing.md's table), longest first: xdist's `--dist loadfile` hands out
# files in collection order, so starting these first keeps one long module from being the run's tail.
HEAVY_FIRST = (
    "test_edge_musetalk_js.py",
    "test_ray_serve.py",
    "test_conversation_live.py",
    "test_server_hardening.py",
    "test_patch_stream.py",
    "test_edge_web.py",
    "test_edge_tts.py",
    "test_browser_talk.py",
    "test_engine_batcher.py",
    "test_server_batching.py",
    "test_browser_player.py",
    "test_bundle_format2.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The heaviest modules first, each module's tests in their own order (a stable sort)."""
    rank = {name: index for index, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(HEAVY_FIRST)))


def _lock_dir(config: pytest.Config) -> Path | None:
    """The folder the workers of this run share (the parent of each worker's basetemp); None: no xdist."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return None
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None:
        return None
    return factory.getbasetemp().parent


@contextlib.contextmanager
def _held(path: Path, exclusive: bool) -> Iterator[None]:
    """`path` flock'ed, exclusive or shared, behind the turnstile beside it."""
    with open(path.with_suffix(".turnstile"), "a+") as turnstile, open(path, "a+") as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)  # a waiting exclusive holder keeps new shared ones out
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Run a `realtime` test with no other worker's test running beside it."""
    folder = _lock_dir(item.config)
    if folder is None:
        yield
        return
    with _held(folder / "realtime.lock", exclusive=item.get_closest_marker("realtime") is not None):
        yield

"""Tests that hold a real-time budget run alone; the heaviest modules are scheduled first.

Under pytest-xdist (`make test` runs two workers), a test marked `realtime` (a turn decided within its
silence, an interrupt within 300 ms) takes an exclusive lock for its call (its fixtures are built and torn
down outside it), kept across consecutive ones, and every other test a shared one for its whole run: while it
runs, the other worker finishes the test it is in and waits, so its clock is measured on an otherwise quiet
machine, as in one process. A turnstile lock keeps a waiting `realtime` test from being starved by the others'
back-to-back shared locks. Modules with such tests run amid short ones, so a waiting one waits little. In one
process (no xdist) nothing is locked.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

_LOCK = pytest.StashKey["_RealtimeLock"]()
_NEXT_REALTIME = pytest.StashKey[bool]()

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
    """The heaviest modules first; the modules with `realtime` tests amid the short ones that follow (the
    other worker is then in tests of a second or two, so a `realtime` test waits little for its lock, and
    no long module is the run's tail); each module's tests in their own order."""
    modules = list(dict.fromkeys(item.path.name for item in items))  # collection order
    timed = list(dict.fromkeys(item.path.name for item in items if _is_realtime(item)))
    heavy = [name for name in HEAVY_FIRST if name in modules and name not in timed]
    rest = [name for name in modules if name not in heavy and name not in timed]
    middle = len(rest) // 2
    order = [*heavy, *rest[:middle], *timed, *rest[middle:]]
    rank = {name: index for index, name in enumerate(order)}
    items.sort(key=lambda item: rank[item.path.name])  # stable: a module's tests keep their order


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


class _RealtimeLock:
    """This worker's hold on the run's lock: shared for one test at a time, exclusive kept across
    consecutive `realtime` tests (released in between, it would wait for a whole test of the other worker)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._exclusive: contextlib.ExitStack | None = None

    def release(self) -> None:
        """Give the exclusive lock back if this worker holds it."""
        if self._exclusive is not None:
            self._exclusive.close()
            self._exclusive = None

    @contextlib.contextmanager
    def around(self, realtime: bool, next_realtime: bool) -> Iterator[None]:
        """Hold the lock as a test of this kind needs while the block runs."""
        if not realtime:
            with _held(self.path, exclusive=False):
                yield
            return
        if self._exclusive is None:
            self._exclusive = contextlib.ExitStack()
            self._exclusive.enter_context(_held(self.path, exclusive=True))
        try:
            yield
        finally:
            if not next_realtime:
                self._exclusive.close()
                self._exclusive = None


def _is_realtime(item: pytest.Item | None) -> bool:
    return item is not None and item.get_closest_marker("realtime") is not None


def _lock_of(config: pytest.Config) -> _RealtimeLock | None:
    """This worker's hold on the run's lock (None: no xdist, nothing to lock)."""
    folder = _lock_dir(config)
    if folder is None:
        return None
    return config.stash.setdefault(_LOCK, _RealtimeLock(folder / "realtime.lock"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Run every other test under the shared lock, setup to teardown; a `realtime` test takes the exclusive
    one for its call only (below), so its fixtures (a server starting, ~2-6 s) are built and torn down
    beside the other worker's test instead of with that worker waiting."""
    lock = _lock_of(item.config)
    if lock is None:
        yield
        return
    if _is_realtime(item):
        item.stash[_NEXT_REALTIME] = _is_realtime(nextitem)
        try:
            yield
        finally:
            if not _is_realtime(nextitem):  # kept for it by the test before, and its call never ran (skipped)
                lock.release()
        return
    with lock.around(False, False):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """A `realtime` test's call with no other worker's test beside it (the lock kept into the next test's
    call when that one is `realtime` too)."""
    lock = _lock_of(item.config)
    if lock is None or not _is_realtime(item):
        yield
        return
    with lock.around(True, item.stash.get(_NEXT_REALTIME, False)):
        yield

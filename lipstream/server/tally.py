"""Whole-server counts for `serve --workers N`: each worker's count in one small shared file.

A worker writes only its own 8-byte cell; the server's count is the sum of the cells. Taking one more
(a session slot, a connection) reads and writes under an exclusive lock on the file, so two workers
admitting at the same instant cannot both take the last slot. The lock is held for microseconds."""

from __future__ import annotations

import fcntl
import os
import struct
from pathlib import Path

_CELL = struct.Struct("<q")


class SharedTally:
    """Per-worker counts in a file shared by the workers of one server; `index` names this worker's cell."""

    def __init__(self, path: Path, workers: int, index: int) -> None:
        if not 0 <= index < workers:
            raise ValueError(f"worker index {index} outside 0..{workers - 1}")
        self.workers = workers
        self.index = index
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        if os.fstat(self._fd).st_size < workers * _CELL.size:
            os.ftruncate(self._fd, workers * _CELL.size)  # zero-filled: no worker counts anything yet

    def _cells(self) -> list[int]:
        raw = os.pread(self._fd, self.workers * _CELL.size, 0)
        return [v for (v,) in _CELL.iter_unpack(raw.ljust(self.workers * _CELL.size, b"\0"))]

    def _write(self, value: int) -> None:
        os.pwrite(self._fd, _CELL.pack(max(0, value)), self.index * _CELL.size)

    def set(self, value: int) -> None:
        """Publish this worker's count."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            self._write(value)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def total(self) -> int:
        """The whole server's count (every worker's last published count)."""
        fcntl.flock(self._fd, fcntl.LOCK_SH)
        try:
            return sum(self._cells())
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def try_add(self, own: int, cap: int) -> bool:
        """With this worker at `own`, take one more unless the server is at `cap`; publishes own + 1."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            cells = self._cells()
            others = sum(cells) - cells[self.index]
            if others + own >= cap:
                return False
            self._write(own + 1)
            return True
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def clear_cell(self, index: int) -> None:
        """Zero a worker's cell (the supervisor does this when that worker died holding counts)."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            os.pwrite(self._fd, _CELL.pack(0), index * _CELL.size)
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

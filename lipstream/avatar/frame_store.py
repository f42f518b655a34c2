"""frames.npy written as it is decoded: a writer thread appends raw frames behind a valid .npy header.

The file is an ordinary .npy (readable with np.load(mmap_mode="r")); memory stays flat because at most
`queue_frames` decoded frames wait in the queue. Sequential file writes release the GIL, so the disk
(and the kernel's dirty-page throttling) overlaps face tracking instead of stalling it, which memmap
page faults inside a numpy assignment do not.
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

import numpy as np

from lipstream.errors import AvatarError


class FrameStore:
    """Append N frames of H×W×3 uint8 to a .npy file in order, on a background thread."""

    def __init__(self, path: Path, count: int, height: int, width: int, queue_frames: int = 6) -> None:
        self.path = Path(path)
        self.shape = (count, height, width, 3)
        self._queue: queue.Queue[np.ndarray | None] = queue.Queue(maxsize=queue_frames)
        self._written = 0
        self._error: BaseException | None = None
        self._file = open(self.path, "wb")  # noqa: SIM115 - closed by the writer thread
        header = {"descr": np.lib.format.dtype_to_descr(np.dtype(np.uint8)), "fortran_order": False}
        np.lib.format.write_array_header_1_0(self._file, {**header, "shape": self.shape})
        self._thread = threading.Thread(target=self._drain, name="frames.npy writer", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        try:
            while (frame := self._queue.get()) is not None:
                if self._error is None:
                    self._file.write(memoryview(frame))
                    self._written += 1
        except BaseException as exc:  # noqa: BLE001 - handed to the caller in close()
            self._error = exc
            while self._queue.get() is not None:  # keep the producer from blocking forever
                pass
        finally:
            self._file.close()

    def append(self, frame: np.ndarray) -> None:
        """Queue the next frame (blocks while the queue is full)."""
        if frame.shape != self.shape[1:] or frame.dtype != np.uint8:
            raise AvatarError(f"frame of shape {frame.shape} does not fit frames.npy {self.shape[1:]}")
        if self._error is not None:
            raise AvatarError(f"cannot write {self.path}: {self._error}") from self._error
        self._queue.put(np.ascontiguousarray(frame))

    def close(self) -> None:
        """Wait for every frame to reach the file; raise if writing failed or frames are missing."""
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise AvatarError(f"cannot write {self.path}: {self._error}") from self._error
        if self._written != self.shape[0]:
            raise AvatarError(f"{self.path} got {self._written} of {self.shape[0]} frames")

    def abort(self) -> None:
        """Stop the writer after a failure elsewhere (the partial file is removed with its folder)."""
        self._error = self._error or RuntimeError("aborted")
        self._queue.put(None)
        self._thread.join()

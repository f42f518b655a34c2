"""A sink that records a live session to an MP4 while its consumer gets the raw frames."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from lipstream.errors import MediaError
from lipstream.media.mp4 import Mp4Writer
from lipstream.render.frames import AvatarFrame
from lipstream.render.sinks import RawFrames


class Mp4Recording(RawFrames):
    """Raw RGB frames for the consumer, and every frame that goes out (picture and audio) written to `path`.

    Only frames handed to the consumer are written, in order, so the file is what was played: speech cut
    by an interrupt is not in it. Encoding runs on a thread of its own; the file appears, whole, on close
    (the writer builds it under a temporary name)."""

    def __init__(self, path: str | Path, crf: int = 23, preset: str = "veryfast") -> None:
        """Record to `path` with x264 at `crf` / `preset`."""
        self.path = Path(path)
        self.crf = crf
        self.preset = preset
        self._writer: Mp4Writer | None = None
        self._thread: ThreadPoolExecutor | None = None
        self._error: BaseException | None = None  # the first failed write; nothing is written after it

    def open(self) -> None:
        """Open the MP4 writer at the stream size (a target that cannot be written raises here)."""
        self._writer = Mp4Writer(
            self.path, self.compositor.width, self.compositor.height, crf=self.crf, preset=self.preset
        )
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="lipstream-record")

    def fill(self, item: AvatarFrame, made: np.ndarray) -> None:
        """The picture goes on `item.image`, and picture and audio to the file."""
        super().fill(item, made)
        if self._thread is not None:
            self._thread.submit(self._write, made, item.audio)

    def _write(self, image: np.ndarray, audio: np.ndarray | None) -> None:
        if self._error is not None or self._writer is None:
            return
        try:
            self._writer.write_frame(image)
            if audio is not None:
                self._writer.write_audio(audio)
        except Exception as exc:  # noqa: BLE001 - reported at close; the live stream goes on meanwhile
            self._error = exc

    @property
    def frames_written(self) -> int:
        """Frames in the file so far."""
        return self._writer.frames_written if self._writer is not None else 0

    def close(self) -> None:
        """Write what is queued and finish the file (a failed write is raised here, and no file is left)."""
        if self._thread is None or self._writer is None:
            return
        self._thread.shutdown(wait=True)
        self._thread = None
        if self._error is not None:
            self._writer.abort()
            raise MediaError(f"recording {self.path.name} failed: {self._error}") from self._error
        self._writer.close()

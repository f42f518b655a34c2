"""MP4 file writer: H.264 (libx264) + AAC, audio aligned with video from the first sample, as played."""

from __future__ import annotations

import logging
import os
import secrets
from fractions import Fraction
from pathlib import Path
from types import TracebackType

import av
import numpy as np

from lipstream.audio.decode import to_float32
from lipstream.audio.timeline import FPS, SAMPLE_RATE
from lipstream.errors import MediaError
from lipstream.media.yuv import check_even_size, tag_bt601, to_video_frame

log = logging.getLogger(__name__)

AAC_FRAME_SAMPLES = (
    1024  # the AAC encoder consumes exactly this many samples per frame (the last may be short)
)


def check_writable_target(path: Path) -> None:
    """Raise MediaError unless a file can be created at path (writable folder exists, path is no folder)."""
    parent = path.parent
    if path.is_dir():
        raise MediaError(f"output path {path} is a folder; give a file name such as out.mp4")
    if not parent.is_dir():
        raise MediaError(f"output folder {parent} does not exist; create it first")
    if not os.access(parent, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise MediaError(f"cannot write to {path}: permission denied; choose another output path")


def _create_temp_beside(path: Path) -> Path:
    """Create an empty hidden file next to path (same file system, so the final rename is atomic)."""
    for _ in range(10):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.part")
        try:
            # Mode 0o666 minus the umask, as the final file would get if written directly.
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            return tmp
        except FileExistsError:
            continue
        except OSError as exc:
            raise MediaError(
                f"cannot create a file in {path.parent} ({exc}); choose another output path"
            ) from exc
    raise MediaError(f"cannot create a temporary file beside {path}; clean up .{path.name}.*.part files")


def x264_options(preset: str, crf: int, tune: str | None = None) -> dict[str, str]:
    """libx264 private options for a preset, a CRF and an optional tune."""
    options = {"crf": str(crf), "preset": preset}
    if tune:
        options["tune"] = tune
    return options


class Mp4Writer:
    """Write RGB frames and mono PCM to an MP4 (H.264 yuv420p + AAC), atomically.

    The file is built beside the target under a hidden temporary name and renamed on close; on any
    error (or leaving the `with` block by an exception) the temporary file is removed, so a partial
    OUT.mp4 never exists. Audio frames carry explicit pts from 0: the AAC encoder then emits its 1024
    priming samples at negative pts and the MP4 muxer writes an edit list that hides them, so a
    player's first audio sample lines up with the first video frame.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        width: int,
        height: int,
        fps: int = FPS,
        sample_rate: int = SAMPLE_RATE,
        crf: int = 23,
        preset: str = "fast",
        audio_bitrate: int = 96_000,
        threads: int = 0,
        tune: str | None = None,
    ) -> None:
        """Check the target and open the encoders; threads=0 lets libx264 choose, tune=None sets none."""
        self.path = Path(path)
        check_writable_target(self.path)
        check_even_size(width, height)
        if fps <= 0 or sample_rate <= 0:
            raise MediaError(f"fps and sample rate must be positive (got {fps}, {sample_rate})")
        self.width, self.height, self.fps, self.sample_rate = width, height, fps, sample_rate
        self.frames_written = 0
        self.samples_written = 0
        self._pending = np.zeros(0, dtype=np.float32)  # audio not yet a whole AAC frame
        self._tmp = _create_temp_beside(self.path)
        try:
            self._container = av.open(
                str(self._tmp), mode="w", format="mp4", options={"movflags": "+faststart"}
            )
            options = x264_options(preset, crf, tune)
            self._video = self._container.add_stream("libx264", rate=fps, options=options)
            self._video.width, self._video.height, self._video.pix_fmt = width, height, "yuv420p"
            self._video.codec_context.time_base = Fraction(1, fps)
            self._video.codec_context.thread_count = threads
            tag_bt601(self._video.codec_context)
            self._audio = self._container.add_stream("aac", rate=sample_rate)
            self._audio.layout = "mono"
            self._audio.bit_rate = audio_bitrate
            self._audio.codec_context.time_base = Fraction(1, sample_rate)
        except (av.error.FFmpegError, ValueError) as exc:
            self._remove_tmp()
            raise MediaError(f"cannot open encoders for {self.path.name} ({exc})") from exc
        self._open = True

    def __enter__(self) -> Mp4Writer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def write_frame(self, image: np.ndarray) -> None:
        """Encode one frame (uint8 RGB H×W×3, or I420 [(H*3/2), W]); shown at 1/fps intervals from 0."""
        self._require_open()
        frame = to_video_frame(image, self.width, self.height)
        frame.pts = self.frames_written
        self._mux(self._video.encode(frame))
        self.frames_written += 1

    def write_audio(self, pcm: np.ndarray) -> None:
        """Append mono PCM (int16 or float in [-1, 1]) at the writer's sample rate; any chunk size."""
        self._require_open()
        samples = to_float32(np.asarray(pcm)).reshape(-1)
        self._pending = np.concatenate([self._pending, samples])
        whole = (len(self._pending) // AAC_FRAME_SAMPLES) * AAC_FRAME_SAMPLES
        for start in range(0, whole, AAC_FRAME_SAMPLES):
            self._encode_audio(self._pending[start : start + AAC_FRAME_SAMPLES])
        self._pending = self._pending[whole:].copy()

    def close(self) -> Path:
        """Flush both encoders, finish the file and move it into place; returns the final path."""
        if not self._open:
            return self.path
        try:
            if len(self._pending):
                self._encode_audio(self._pending)
                self._pending = np.zeros(0, dtype=np.float32)
            self._mux(self._video.encode(None))
            self._mux(self._audio.encode(None))
            self._container.close()
            self._open = False
            os.replace(self._tmp, self.path)
        except (av.error.FFmpegError, OSError) as exc:
            self.abort()
            raise MediaError(f"could not finish {self.path} ({exc}); check free disk space") from exc
        except BaseException:
            self.abort()
            raise
        log.info("wrote %s: %d frames, %.2f s audio", self.path, self.frames_written, self.audio_seconds)
        return self.path

    def abort(self) -> None:
        """Stop writing and remove the temporary file; the target path is left untouched."""
        if self._open:
            self._open = False
            try:
                self._container.close()
            except (av.error.FFmpegError, OSError, ValueError):
                pass  # the file is being discarded; its trailer does not matter
        self._remove_tmp()

    @property
    def audio_seconds(self) -> float:
        """Seconds of audio accepted so far."""
        return (self.samples_written + len(self._pending)) / self.sample_rate

    def _encode_audio(self, samples: np.ndarray) -> None:
        """Encode one AAC frame's worth of samples with an explicit pts (needed for the priming edit list)."""
        frame = av.AudioFrame.from_ndarray(
            np.ascontiguousarray(samples, dtype=np.float32).reshape(1, -1), format="flt", layout="mono"
        )
        frame.sample_rate = self.sample_rate
        frame.pts = self.samples_written
        frame.time_base = Fraction(1, self.sample_rate)
        self.samples_written += len(samples)
        self._mux(self._audio.encode(frame))

    def _mux(self, packets: list[av.Packet]) -> None:
        """Hand encoded packets to the MP4 muxer."""
        if packets:
            self._container.mux(packets)

    def _require_open(self) -> None:
        """Raise if the writer was closed or aborted."""
        if not self._open:
            raise MediaError(f"MP4 writer for {self.path.name} is already closed")

    def _remove_tmp(self) -> None:
        """Delete the temporary file if it is still there."""
        try:
            self._tmp.unlink(missing_ok=True)
        except OSError as exc:
            log.warning("could not remove temporary file %s: %s", self._tmp, exc)

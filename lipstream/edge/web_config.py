"""What `lipstream export web` is asked to write, and the error it gives when it cannot."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from lipstream.errors import LipstreamError


@dataclass(frozen=True)
class WebExportConfig:
    """What to export and how the base loop and the crops are encoded."""

    engine: str = "viseme"
    # --engine musetalk: folders written by `lipstream export onnx` (one per precision, e.g. float16 and
    # float32), or a folder holding such folders; the page picks a precision by the viewer's GPU
    onnx_dirs: tuple[Path, ...] = ()
    include_page: bool = True  # False: data only (lipstream serve serves the page from the package)
    video_crf: int = 23
    video_preset: str = "veryfast"
    video_gop: int = 25  # one key frame a second: a seek decodes at most 24 frames
    crop_quality: int = 92  # JPEG quality of the 256² crops the mouth warp samples from
    voice: Path | None = None  # a Piper voice ONNX (config beside it as .onnx.json): text in the browser


class ExportError(LipstreamError):
    """An export that cannot be written (unknown engine, missing caches or models)."""

"""A Piper voice model that reports phoneme alignments, patched once and kept on disk.

Piper gives the per-phoneme timings the mouth follows only from a model with an extra output.
`PiperVoice.load` adds it in memory on every load: importing `onnx` and patching the 60 MB graph take ~0.9 s
of the ~1.2 s a load costs (2-core AMD EPYC), paid by every server worker and session pool at start, twice for
a pool with its own thread count. The patched model is written once to the user's cache
(`$XDG_CACHE_HOME/lipstream/piper`, default ~/.cache) and later loads read it directly (~0.3 s). Where the
cache cannot be written, the model is patched in memory as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from importlib import metadata
from pathlib import Path

log = logging.getLogger(__name__)


def cache_folder() -> Path:
    """Where patched voices are kept: $XDG_CACHE_HOME/lipstream/piper (default ~/.cache/lipstream/piper)."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "lipstream" / "piper"


def aligned_name(model: Path) -> str:
    """The cached file's name: the source's name, size and modification time, and piper's version (a new
    patcher or a replaced voice makes a new file)."""
    stat = model.stat()
    try:
        piper_version = metadata.version("piper-tts")
    except metadata.PackageNotFoundError:
        piper_version = "unknown"
    return f"{model.stem}-{stat.st_size}-{stat.st_mtime_ns}-piper{piper_version}-aligned.onnx"


def patched_bytes(model: Path) -> bytes:
    """The voice with its alignment output added (as piper's own loader does), serialized."""
    import onnx
    from piper.patch_voice_with_alignment import add_alignment_output

    graph = onnx.load(str(model))
    with contextlib.suppress(ValueError):  # already patched: use as is
        add_alignment_output(graph)
    return graph.SerializeToString()


def aligned_model(model: Path, folder: Path | None = None) -> Path | bytes:
    """The voice patched for alignments: a cached file (written now if missing), or the patched bytes when
    the cache folder cannot be written."""
    folder = folder if folder is not None else cache_folder()
    cached = folder / aligned_name(model)
    if cached.is_file():
        return cached
    data = patched_bytes(model)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        # written beside its final name and renamed: two processes starting at once never read half a file
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".part", delete=False) as part:
            part.write(data)
        os.replace(part.name, cached)
    except OSError as exc:
        log.info("cannot cache the patched Piper voice in %s (%s): patched in memory", folder, exc)
        with contextlib.suppress(OSError, UnboundLocalError):
            os.unlink(part.name)
        return data
    return cached


def forget(cached: Path | bytes) -> None:
    """Remove a cached file that failed to load (a damaged cache), so the next load patches again."""
    if isinstance(cached, Path):
        with contextlib.suppress(OSError):
            cached.unlink()

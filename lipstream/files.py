"""Writing files and folders safely: each appears whole or not at all; file digests."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO


@contextmanager
def atomic_file(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """An open temp file beside `path`; on success it replaces `path`, on failure it is removed, so a
    reader never sees half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode) as handle:
            yield handle
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_folder(
    final: Path, replace: bool, exists_error: Exception, world_readable: bool = False
) -> Iterator[Path]:
    """Yield a temp folder beside `final`; on success it replaces `final`, on failure it is removed.

    `exists_error` is raised when `final` exists and `replace` is false; `world_readable` gives the folder
    0755 (mkdtemp makes 0700: a static web server run as another user must read an export)."""
    final = Path(final)
    if final.exists() and not replace:
        raise exists_error
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.partial-"))
    try:
        yield tmp
        if world_readable:
            os.chmod(tmp, 0o755)
        if final.exists():
            trash = final.parent / f".{final.name}.old-{os.getpid()}"
            os.replace(final, trash)
            os.replace(tmp, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()

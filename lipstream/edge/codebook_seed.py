"""The MuseTalk codebook in the form the browser engine seeds itself from (docs/web-export.md).

One little-endian binary file: hyperplanes float32 [bits, dim], the hashing centre float32 [dim], codes
as uint32 (lo, hi) pairs [entries, 2], then RGB uint8 patches [entries, size, size, 3]. The hyperplanes
always travel, even with no entries: the browser cannot redraw numpy's generator, and codes are only
comparable between Python and JS when both hash with the same planes.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from lipstream.files import atomic_file
from lipstream.render.codebook import SimHashCodebook


def write_codebook_seed(book: SimHashCodebook, path: str | os.PathLike, relative_to: Path) -> dict[str, Any]:
    """Write `book` as a browser seed at `path` (temp file, then rename); return its export.json entry."""
    target = Path(path)
    size = book.size
    patches = book.patches[:size] if book.patches is not None else np.zeros((0, 256, 256, 3), np.uint8)
    if size and patches.shape[1:] != (patches.shape[1], patches.shape[1], 3):
        raise ValueError(f"codebook patches must be square RGB, got {patches.shape[1:]}")
    codes = book.codes[:size].astype("<u8")
    pairs = np.stack([codes & np.uint64(0xFFFFFFFF), codes >> np.uint64(32)], axis=1).astype("<u4")
    blob = b"".join(
        [
            book.hyperplanes.astype("<f4").tobytes(),
            book.mean.astype("<f4").tobytes(),
            pairs.tobytes(),
            np.ascontiguousarray(patches, np.uint8).tobytes(),
        ]
    )
    with atomic_file(target) as fh:
        fh.write(blob)
    return {
        "file": target.relative_to(relative_to).as_posix(),
        "dim": book.dim,
        "bits": book.bits,
        "seed": book.seed,
        "entries": size,
        "threshold": book.threshold,
        "maxEntries": book.max_entries,
        "meanCount": book._mean_count,
        "meanWarmup": book.mean_warmup,
        "patchSize": int(patches.shape[1]) if size else 256,
        "sha256": hashlib.sha256(blob).hexdigest(),
    }

"""A bounded viseme codebook: SimHash of a keyframe's audio features -> cached mouth patch."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lipstream.errors import AvatarError
from lipstream.files import atomic_file

FORMAT_VERSION = 1


@dataclass(frozen=True)
class Lookup:
    """Result of a codebook lookup: patch on a hit (None on a miss), entry and Hamming distance."""

    patch: np.ndarray | None
    entry: int  # -1 on a miss
    distance: int  # to the nearest entry; bits + 1 when the codebook is empty


def pack_signs(signs: np.ndarray) -> np.ndarray:
    """Pack boolean rows [N, bits <= 64] into uint64 codes (bit i = sign of hyperplane i)."""
    rows = np.asarray(signs, dtype=bool)
    padded = np.zeros((rows.shape[0], 64), dtype=bool)
    padded[:, : rows.shape[1]] = rows
    return np.packbits(padded, axis=1, bitorder="little").view("<u8").reshape(-1).astype(np.uint64)


def hamming(codes: np.ndarray, code: int | np.uint64) -> np.ndarray:
    """Hamming distance of every code to one code, by popcount of the XOR (vectorised)."""
    return np.bitwise_count(np.asarray(codes, dtype=np.uint64) ^ np.uint64(code)).astype(np.int64)


class SimHashCodebook:
    """Cache of mouth patches keyed by a SimHash of audio features, looked up by Hamming distance.

    - Hash: the signs of the centred feature vector's projections on `bits` random hyperplanes drawn
      from `seed`. Centring matters: raw features share a large common component, which would give
      nearly every frame the same signs. The centre is `mean` when given; otherwise a running mean of
      the first `mean_warmup` hashed vectors, then frozen so codes stay comparable.
    - Lookup: the nearest entry by popcount(XOR); a hit when the distance is <= threshold.
    - Bounds: at most `max_entries` entries. Inserting into a full codebook evicts the least recently
      used entry (the one whose last hit or insert is oldest), so shapes that keep recurring stay.
    """

    def __init__(
        self,
        dim: int,
        bits: int = 64,
        seed: int = 0,
        max_entries: int = 4096,
        threshold: int = 2,
        mean: np.ndarray | None = None,
        mean_warmup: int = 200,
    ) -> None:
        """Draw the hyperplanes; patches are allocated on the first insert (their shape comes from it)."""
        if not 1 <= bits <= 64:
            raise ValueError(f"bits must be in 1..64, got {bits}")
        if dim <= 0 or max_entries <= 0 or threshold < 0:
            raise ValueError("dim and max_entries must be positive and threshold non-negative")
        self.dim, self.bits, self.seed = dim, bits, seed
        self.max_entries, self.threshold, self.mean_warmup = max_entries, threshold, mean_warmup
        self.hyperplanes = np.random.default_rng(seed).standard_normal((bits, dim)).astype(np.float32)
        self._mean = np.zeros(dim, np.float64) if mean is None else np.asarray(mean, np.float64).reshape(dim)
        self._mean_count = mean_warmup if mean is not None else 0
        self.codes = np.zeros(max_entries, dtype=np.uint64)
        self.patches: np.ndarray | None = None
        self.uses = np.zeros(max_entries, dtype=np.int64)  # hits + the insert
        self.last_used = np.zeros(max_entries, dtype=np.int64)  # tick of the last hit or insert
        self.size = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self._tick = 0

    @property
    def mean(self) -> np.ndarray:
        """The centre subtracted before hashing."""
        return self._mean.astype(np.float32)

    def hash(self, features: np.ndarray) -> np.ndarray:
        """SimHash codes (uint64 [N]) of feature vectors [N, dim] (or one vector [dim])."""
        feats = np.asarray(features, dtype=np.float32).reshape(-1, self.dim)
        self._update_mean(feats)
        projections = (feats - self._mean.astype(np.float32)) @ self.hyperplanes.T
        return pack_signs(projections > 0)

    def lookup(self, code: int | np.uint64) -> Lookup:
        """Find the nearest entry; counts a hit (and refreshes the entry) or a miss."""
        self._tick += 1
        if self.size == 0:
            self.misses += 1
            return Lookup(None, -1, self.bits + 1)
        distances = hamming(self.codes[: self.size], code)
        entry = int(np.argmin(distances))
        distance = int(distances[entry])
        if distance > self.threshold:
            self.misses += 1
            return Lookup(None, -1, distance)
        self.hits += 1
        self.uses[entry] += 1
        self.last_used[entry] = self._tick
        return Lookup(self.patches[entry], entry, distance)

    def insert(self, code: int | np.uint64, patch: np.ndarray) -> int:
        """Store a patch under a code (evicting the least recently used entry when full); returns its slot."""
        patch = np.asarray(patch)
        if patch.dtype != np.uint8:
            raise ValueError(f"patches are uint8, got {patch.dtype}")
        if self.patches is None:
            self.patches = np.zeros((self.max_entries, *patch.shape), dtype=np.uint8)
        elif patch.shape != self.patches.shape[1:]:
            raise ValueError(
                f"patch shape {patch.shape} differs from the codebook's {self.patches.shape[1:]}"
            )
        self._tick += 1
        if self.size < self.max_entries:
            slot = self.size
            self.size += 1
        else:
            slot = int(np.argmin(self.last_used[: self.size]))
            self.evictions += 1
        self.codes[slot] = np.uint64(code)
        self.patches[slot] = patch
        self.uses[slot] = 1
        self.last_used[slot] = self._tick
        return slot

    def save(self, path: str | os.PathLike) -> Path:
        """Write the codebook to an .npz (atomically: temporary file, then rename)."""
        target = Path(path)
        patches = self.patches[: self.size] if self.patches is not None else np.zeros((0, 1, 1, 3), np.uint8)
        with atomic_file(target) as handle:
            np.savez(
                handle,
                version=np.int64(FORMAT_VERSION),
                hyperplanes=self.hyperplanes,
                seed=np.int64(self.seed),
                bits=np.int64(self.bits),
                threshold=np.int64(self.threshold),
                max_entries=np.int64(self.max_entries),
                mean=self._mean.astype(np.float32),
                mean_count=np.int64(self._mean_count),
                mean_warmup=np.int64(self.mean_warmup),
                codes=self.codes[: self.size],
                patches=patches,
                uses=self.uses[: self.size],
                last_used=self.last_used[: self.size],
                counters=np.array([self.hits, self.misses, self.evictions, self._tick], np.int64),
            )
        return target

    @classmethod
    def load(cls, path: str | os.PathLike) -> SimHashCodebook:
        """Read a codebook written by save(); AvatarError if it is missing or malformed."""
        source = Path(path)
        try:
            with np.load(source, allow_pickle=False) as data:
                arrays = {key: data[key] for key in data.files}
        except (OSError, ValueError, EOFError) as exc:
            raise AvatarError(f"cannot read codebook {source} ({exc}); delete it to rebuild") from exc
        try:
            if int(arrays["version"]) != FORMAT_VERSION:
                raise AvatarError(
                    f"codebook {source} has format {int(arrays['version'])}; delete it to rebuild"
                )
            bits, dim = arrays["hyperplanes"].shape
            book = cls(
                dim,
                bits=bits,
                seed=int(arrays["seed"]),
                max_entries=int(arrays["max_entries"]),
                threshold=int(arrays["threshold"]),
                mean=arrays["mean"],
                mean_warmup=int(arrays["mean_warmup"]),
            )
            book.hyperplanes = arrays["hyperplanes"].astype(np.float32)
            book._mean_count = int(arrays["mean_count"])
            size = len(arrays["codes"])
            if size > book.max_entries or len(arrays["patches"]) != size:
                raise AvatarError(
                    f"codebook {source} is inconsistent (entries vs patches); delete it to rebuild"
                )
            book.size = size
            book.codes[:size] = arrays["codes"]
            book.uses[:size] = arrays["uses"]
            book.last_used[:size] = arrays["last_used"]
            if size:
                book.patches = np.zeros((book.max_entries, *arrays["patches"].shape[1:]), np.uint8)
                book.patches[:size] = arrays["patches"]
            book.hits, book.misses, book.evictions, book._tick = (int(v) for v in arrays["counters"])
        except KeyError as exc:
            raise AvatarError(f"codebook {source} lacks field {exc}; delete it to rebuild") from exc
        return book

    def _update_mean(self, feats: np.ndarray) -> None:
        """Fold vectors into the running mean until the warm-up count is reached, then keep it fixed."""
        room = self.mean_warmup - self._mean_count
        if room <= 0 or len(feats) == 0:
            return
        take = feats[:room].astype(np.float64)
        total = self._mean_count + len(take)
        self._mean = (self._mean * self._mean_count + take.sum(axis=0)) / total
        self._mean_count = total

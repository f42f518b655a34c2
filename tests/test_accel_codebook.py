"""SimHash codebook: hash properties, lookup, LRU bounds and persistence."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lipstream.errors import AvatarError
from lipstream.render.codebook import SimHashCodebook, hamming, pack_signs

DIM = 32


def _feature_frames(n: int, seed: int = 0) -> np.ndarray:
    """Feature-like vectors: a large shared offset (as in log-mel / MFCC) plus per-frame structure."""
    rng = np.random.default_rng(seed)
    offset = 5.0 + rng.standard_normal(DIM)
    return (offset + rng.standard_normal((n, DIM))).astype(np.float32)


def test_pack_and_hamming() -> None:
    signs = np.zeros((2, 64), bool)
    signs[1, [0, 5, 63]] = True
    codes = pack_signs(signs)
    assert codes.dtype == np.uint64 and codes[0] == 0 and codes[1] == (1 | 1 << 5 | 1 << 63)
    assert hamming(codes, codes[1]).tolist() == [3, 0]


def test_simhash_identical_small_and_unrelated() -> None:
    frames = _feature_frames(400)
    book = SimHashCodebook(DIM, seed=3, mean=frames.mean(axis=0))
    rng = np.random.default_rng(1)
    codes = book.hash(frames)
    assert np.array_equal(book.hash(frames), codes)  # identical -> distance 0
    assert hamming(codes, codes[0])[0] == 0
    spread = frames.std(axis=0)
    noisy = frames + 0.02 * spread * rng.standard_normal(frames.shape).astype(np.float32)
    near = np.bitwise_count(codes ^ book.hash(noisy))
    far = np.bitwise_count(codes ^ np.roll(codes, 1))
    near_rate = np.mean(near <= book.threshold)
    far_rate = np.mean(far <= book.threshold)
    assert near_rate > 0.8 and far_rate < 0.02, (near_rate, far_rate)
    assert 24 < np.median(far) < 40  # unrelated frames sit near bits / 2


def test_centring_makes_signs_informative() -> None:
    frames = _feature_frames(300)
    uncentred = SimHashCodebook(DIM, seed=3, mean=np.zeros(DIM))
    running = SimHashCodebook(DIM, seed=3, mean_warmup=300)  # learns the centre from what it hashes
    raw = uncentred.hash(frames)
    centred = running.hash(frames)
    assert np.allclose(running.mean, frames.mean(axis=0), atol=1e-4)
    raw_far = np.median(np.bitwise_count(raw ^ np.roll(raw, 1)))
    centred_far = np.median(np.bitwise_count(centred ^ np.roll(centred, 1)))
    assert raw_far < 0.6 * centred_far  # the shared offset pulls every uncentred code together


def test_lookup_insert_hits_and_misses() -> None:
    book = SimHashCodebook(DIM, seed=1, mean=np.zeros(DIM), threshold=2)
    patch = np.full((8, 8, 3), 7, np.uint8)
    code = np.uint64(0b1011)
    assert book.lookup(code).patch is None and book.misses == 1
    book.insert(code, patch)
    hit = book.lookup(code ^ np.uint64(0b11))  # 2 bits away: within threshold
    assert hit.patch is not None and np.array_equal(hit.patch, patch) and hit.distance == 2
    assert book.lookup(code ^ np.uint64(0b111)).patch is None  # 3 bits away
    assert (book.hits, book.misses) == (1, 2)
    with pytest.raises(ValueError, match="shape"):
        book.insert(np.uint64(1), np.zeros((4, 4, 3), np.uint8))


def test_bounded_with_lru_eviction() -> None:
    book = SimHashCodebook(DIM, max_entries=3, mean=np.zeros(DIM), threshold=0)
    patches = [np.full((4, 4, 3), i, np.uint8) for i in range(5)]
    for i in range(3):
        book.insert(np.uint64(1 << (8 * i)), patches[i])
    assert book.lookup(np.uint64(1)).entry == 0  # entry 0 is now the most recently used
    book.insert(np.uint64(1 << 40), patches[3])  # evicts entry 1, the least recently used
    assert book.size == 3 and book.evictions == 1
    assert book.lookup(np.uint64(1 << 8)).patch is None
    assert book.lookup(np.uint64(1)).patch[0, 0, 0] == 0
    for i in range(20):
        book.insert(np.uint64(1 << (i % 64)) | np.uint64(1 << 63), patches[4])
    assert book.size == 3


def test_save_load_round_trip(tmp_path: Path) -> None:
    frames = _feature_frames(50, seed=4)
    book = SimHashCodebook(DIM, seed=9, max_entries=16, mean_warmup=20)
    codes = book.hash(frames)
    for i, code in enumerate(codes[:10]):
        book.insert(code, np.full((6, 6, 3), i, np.uint8))
    book.lookup(codes[3])
    path = book.save(tmp_path / "codebook.npz")
    loaded = SimHashCodebook.load(path)
    assert (loaded.seed, loaded.bits, loaded.size, loaded.max_entries) == (9, 64, 10, 16)
    assert np.array_equal(loaded.hyperplanes, book.hyperplanes)
    assert np.array_equal(loaded.hash(frames), codes)  # same hash after reload
    assert np.array_equal(loaded.patches[:10], book.patches[:10])
    assert (loaded.hits, loaded.misses) == (book.hits, book.misses)
    assert loaded.lookup(codes[3]).patch[0, 0, 0] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["codebook.npz"]  # no temporary file left


def test_load_errors(tmp_path: Path) -> None:
    junk = tmp_path / "junk.npz"
    junk.write_bytes(b"nonsense")
    with pytest.raises(AvatarError, match="cannot read codebook"):
        SimHashCodebook.load(junk)
    partial = tmp_path / "partial.npz"
    np.savez(partial, version=np.int64(1), hyperplanes=np.zeros((64, 4), np.float32))
    with pytest.raises(AvatarError, match="lacks field"):
        SimHashCodebook.load(partial)

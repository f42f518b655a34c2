"""Frames between keyframes: a linear cross-fade of the two neighbouring keyframe patches, in place."""

from __future__ import annotations

import numpy as np

# Weights are fixed-point with 8 fractional bits: 255 * 256 + 128 fits in uint16, so one uint16
# scratch buffer holds the whole sum and no float image is ever allocated.
_ONE = 256


class CrossFader:
    """Reusable scratch space for cross-fading uint8 patches of one shape without allocating per frame."""

    def __init__(self, shape: tuple[int, ...]) -> None:
        """Allocate two uint16 buffers of the patch shape."""
        self.shape = tuple(shape)
        self._acc = np.empty(self.shape, dtype=np.uint16)
        self._tmp = np.empty(self.shape, dtype=np.uint16)

    def blend(self, patch_a: np.ndarray, patch_b: np.ndarray, t: float, out: np.ndarray) -> np.ndarray:
        """Write round((1 - t) * a + t * b) into out (uint8); t = 0 gives exactly a and t = 1 exactly b."""
        if patch_a.shape != self.shape or patch_b.shape != self.shape or out.shape != self.shape:
            raise ValueError(f"patches and out must have shape {self.shape}")
        if patch_a.dtype != np.uint8 or patch_b.dtype != np.uint8 or out.dtype != np.uint8:
            raise ValueError("cross-fade works on uint8 patches")
        weight_b = int(round(min(max(float(t), 0.0), 1.0) * _ONE))
        np.multiply(patch_a, np.uint16(_ONE - weight_b), out=self._acc)
        np.multiply(patch_b, np.uint16(weight_b), out=self._tmp)
        self._acc += self._tmp
        self._acc += _ONE // 2  # round to nearest
        self._acc >>= 8
        np.copyto(out, self._acc, casting="unsafe")
        return out


def crossfade(
    patch_a: np.ndarray,
    patch_b: np.ndarray,
    t: float,
    out: np.ndarray | None = None,
    fader: CrossFader | None = None,
) -> np.ndarray:
    """Linear cross-fade of two uint8 patches at position t in [0, 1], into out (allocated if None)."""
    fader = fader or CrossFader(patch_a.shape)
    target = np.empty_like(patch_a) if out is None else out
    return fader.blend(patch_a, patch_b, t, target)


def fill_between(
    key_a: np.ndarray, key_b: np.ndarray, out: np.ndarray, fader: CrossFader | None = None
) -> np.ndarray:
    """Fill out[0..n) with the n frames strictly between two keyframes (t = (i + 1) / (n + 1))."""
    count = out.shape[0]
    fader = fader or CrossFader(key_a.shape)
    for i in range(count):
        fader.blend(key_a, key_b, (i + 1) / (count + 1), out[i])
    return out

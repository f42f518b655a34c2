// Per-pixel work on RGBA words (little-endian: R in the low byte, alpha in the high byte), one Uint32
// write per pixel, no per-channel clamping calls.

/** The VAE graph's output (RGB planes of batch item `item`, already clamped and rounded to 0..255 in the
 * graph, as the Python engine rounds) -> RGBA words with the mask as alpha. The +0.5 only guards against
 * a value a hair under its integer; no clamping is needed (or done) here. */
export function packPatch(chw, item, size, alpha, out) {
  const plane = size * size;
  const base = item * 3 * plane;
  const g0 = base + plane, b0 = base + 2 * plane;
  if (alpha) {
    for (let p = 0; p < plane; p++) {
      out[p] = (alpha[p] << 24) | (((chw[b0 + p] + 0.5) | 0) << 16) | (((chw[g0 + p] + 0.5) | 0) << 8) | ((chw[base + p] + 0.5) | 0);
    }
  } else {
    for (let p = 0; p < plane; p++) {
      out[p] = 0xff000000 | (((chw[b0 + p] + 0.5) | 0) << 16) | (((chw[g0 + p] + 0.5) | 0) << 8) | ((chw[base + p] + 0.5) | 0);
    }
  }
  return out;
}

/** Cross-fade of two RGBA-word patches at t (lipstream/render/infill.py's 8.8 fixed point, two channels
 * per 32-bit lane pair), alpha taken from `alpha` (Uint8Array mask, or 255 when null). Pixels whose mask
 * alpha is 0 come out as 0 (transparent): the compositor never shows them; every other pixel is bit-equal. */
export function crossfade(a, b, t, alpha, out) {
  const wb = roundHalfEven((t < 0 ? 0 : t > 1 ? 1 : t) * 256);
  const wa = 256 - wb;
  const n = a.length;
  // Math.imul keeps the products in int32 (the JIT's fast path); the R|B sum can pass 2^31, and `>>> 8`
  // reads it as uint32, which is exact since it stays below 2^32 (255*256 + 128 per 16-bit lane).
  if (!alpha) {
    for (let p = 0; p < n; p++) {
      const pa = a[p], pb = b[p];
      const rb = ((Math.imul(pa & 0x00ff00ff, wa) + Math.imul(pb & 0x00ff00ff, wb) + 0x00800080) >>> 8) & 0x00ff00ff;
      const g = ((Math.imul(pa & 0x0000ff00, wa) + Math.imul(pb & 0x0000ff00, wb) + 0x00008000) >>> 8) & 0x0000ff00;
      out[p] = 0xff000000 | rb | g;
    }
    return out;
  }
  for (let p = 0; p < n; p++) {
    const m = alpha[p];
    if (m === 0) { out[p] = 0; continue; } // outside the mouth mask: never drawn, so not blended
    const pa = a[p], pb = b[p];
    const rb = ((Math.imul(pa & 0x00ff00ff, wa) + Math.imul(pb & 0x00ff00ff, wb) + 0x00800080) >>> 8) & 0x00ff00ff;
    const g = ((Math.imul(pa & 0x0000ff00, wa) + Math.imul(pb & 0x0000ff00, wb) + 0x00008000) >>> 8) & 0x0000ff00;
    out[p] = (m << 24) | rb | g;
  }
  return out;
}

/** Put a mask in the alpha lane of a stored patch (a codebook hit shown on another source frame). */
export function withAlpha(patch, alpha, out) {
  for (let p = 0; p < patch.length; p++) out[p] = ((alpha ? alpha[p] : 255) << 24) | (patch[p] & 0x00ffffff);
  return out;
}

function roundHalfEven(x) {
  const f = Math.floor(x);
  const d = x - f;
  if (d > 0.5) return f + 1;
  if (d < 0.5) return f;
  return f % 2 === 0 ? f : f + 1;
}

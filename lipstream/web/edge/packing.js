// Float -> RGBA with the mouth mask in alpha: ONE Uint32 write per pixel, no per-channel clamping calls.

/**
 * Pack a planar [3, n] float image in [-1, 1] (a VAE's output) into out32 (Uint32Array n) with mask (Uint8Array n)
 * in alpha; little-endian RGBA: r | g << 8 | b << 16 | a << 24.
 */
export function packPlanarSigned(planes, mask, out32) {
  const n = mask.length;
  for (let i = 0; i < n; i++) {
    // (v + 1) * 127.5 + 0.5, clamped by comparisons (no Math.min/max calls), truncated by | 0
    let r = planes[i] * 127.5 + 128.0;
    let g = planes[n + i] * 127.5 + 128.0;
    let b = planes[2 * n + i] * 127.5 + 128.0;
    r = r < 0 ? 0 : r > 255 ? 255 : r;
    g = g < 0 ? 0 : g > 255 ? 255 : g;
    b = b < 0 ? 0 : b > 255 ? 255 : b;
    out32[i] = ((r | 0) | ((g | 0) << 8) | ((b | 0) << 16) | (mask[i] << 24)) >>> 0;
  }
  return out32;
}

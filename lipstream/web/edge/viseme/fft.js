// Power spectrum of a real frame (zero-padded to a power of two), as numpy's |rfft(x, n)|**2.

/** Precomputed twiddles and bit reversal for one FFT size. */
export function createFft(n) {
  if (n & (n - 1)) throw new Error(`FFT size ${n} is not a power of two`);
  const rev = new Uint32Array(n);
  const bits = Math.log2(n);
  for (let i = 0; i < n; i++) {
    let r = 0;
    for (let b = 0; b < bits; b++) r |= ((i >> b) & 1) << (bits - 1 - b);
    rev[i] = r;
  }
  const cos = new Float64Array(n / 2);
  const sin = new Float64Array(n / 2);
  for (let i = 0; i < n / 2; i++) {
    cos[i] = Math.cos((2 * Math.PI * i) / n);
    sin[i] = -Math.sin((2 * Math.PI * i) / n);
  }
  return { n, rev, cos, sin, re: new Float64Array(n), im: new Float64Array(n) };
}

/** |X[k]|^2 for k = 0..n/2 of the real input `x` (length <= n, zero-padded), written into `out`. */
export function powerSpectrum(fft, x, out) {
  const { n, rev, cos, sin, re, im } = fft;
  re.fill(0);
  im.fill(0);
  for (let i = 0; i < x.length; i++) re[rev[i]] = x[i];
  for (let size = 2; size <= n; size <<= 1) {
    const half = size >> 1;
    const step = n / size;
    for (let start = 0; start < n; start += size) {
      for (let j = 0; j < half; j++) {
        const wr = cos[j * step];
        const wi = sin[j * step];
        const a = start + j;
        const b = a + half;
        const tr = re[b] * wr - im[b] * wi;
        const ti = re[b] * wi + im[b] * wr;
        re[b] = re[a] - tr;
        im[b] = im[a] - ti;
        re[a] += tr;
        im[a] += ti;
      }
    }
  }
  for (let k = 0; k <= n / 2; k++) out[k] = re[k] * re[k] + im[k] * im[k];
  return out;
}

// Port of OpeningCurve.warp_opening (lipstream/engines/viseme/calibration.py).

/** Warp opening whose measured aperture lies `command` of the way from rest to the widest one. */
export function warpOpening(curve, command) {
  const c = Math.min(Math.max(command, 0), 1);
  const { levels, aperture } = curve;
  const L = aperture.length;
  const mono = new Float64Array(L);
  let running = -Infinity;
  for (let i = 0; i < L; i++) { running = Math.max(running, aperture[i]); mono[i] = running; }
  if (mono[L - 1] - mono[0] <= 1e-6) return c;
  const target = mono[0] + c * (mono[L - 1] - mono[0]);
  for (let i = 0; i < L; i++) mono[i] = Math.fround(mono[i] + Math.fround(i * 1e-6));
  return interp(target, mono, levels);
}

/** np.interp for one value (xp increasing; clamped at the ends). */
export function interp(x, xp, fp) {
  const n = xp.length;
  if (x <= xp[0]) return fp[0];
  if (x >= xp[n - 1]) return fp[n - 1];
  let lo = 0, hi = n - 1;
  while (hi - lo > 1) {
    const mid = (lo + hi) >> 1;
    if (xp[mid] <= x) lo = mid; else hi = mid;
  }
  const t = (x - xp[lo]) / (xp[hi] - xp[lo]);
  return fp[lo] + t * (fp[hi] - fp[lo]);
}

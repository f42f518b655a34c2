// Which 40 ms frames are silent: lipstream/audio/levels.py's SilenceDetector and render/accel.py's
// speaking_mask, same constants (-45 dBFS, silent runs of at least 3 frames, a 2-frame speaking margin).

export const SAMPLES_PER_FRAME = 640; // 40 ms at 16 kHz
const FLOOR_DBFS = -120;

/** RMS level of each whole 40 ms frame, dBFS (Float32Array [floor(n / 640)]). */
export function frameRms(pcm) {
  const n = Math.floor(pcm.length / SAMPLES_PER_FRAME);
  const out = new Float32Array(n);
  const floor = 10 ** (FLOOR_DBFS / 20);
  for (let f = 0; f < n; f++) {
    let acc = 0;
    for (let i = f * SAMPLES_PER_FRAME, end = i + SAMPLES_PER_FRAME; i < end; i++) {
      const v = Math.fround(pcm[i]);
      acc += v * v;
    }
    const rms = Math.sqrt(acc / SAMPLES_PER_FRAME);
    out[f] = 20 * Math.log10(rms > floor ? rms : floor);
  }
  return out;
}

/** Silent mask from levels: below threshold, and only runs of at least minSilentFrames count. */
export function silentMask(levels, thresholdDbfs = -45, minSilentFrames = 3) {
  const mask = new Uint8Array(levels.length);
  for (let i = 0; i < levels.length; i++) mask[i] = levels[i] < thresholdDbfs ? 1 : 0;
  if (minSilentFrames <= 1) return mask;
  for (let i = 0; i < mask.length;) {
    if (!mask[i]) { i++; continue; }
    let j = i;
    while (j < mask.length && mask[j]) j++;
    if (j - i < minSilentFrames) mask.fill(0, i, j);
    i = j;
  }
  return mask;
}

/** Frames that get a patch: not silent, widened by `margin` frames each side (onsets and releases). */
export function speakingMask(silent, margin = 2) {
  const out = new Uint8Array(silent.length);
  for (let i = 0; i < silent.length; i++) {
    if (silent[i]) continue;
    for (let d = -margin; d <= margin; d++) if (i + d >= 0 && i + d < silent.length) out[i + d] = 1;
  }
  return out;
}

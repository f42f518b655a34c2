// Port of lipstream/audio/levels.py: per-frame RMS in dBFS and the silence mask with its minimum run.
import { SAMPLES_PER_FRAME } from './acoustic.js';

const SILENCE_FLOOR_DBFS = -120.0;

/** frame_rms: dBFS of each whole 40 ms frame of pcm[start, end). */
export function frameRms(pcm, start = 0, end = pcm.length) {
  const n = Math.max(0, Math.floor((end - start) / SAMPLES_PER_FRAME));
  const out = new Float64Array(n);
  const floor = 10 ** (SILENCE_FLOOR_DBFS / 20.0);
  for (let f = 0; f < n; f++) {
    let acc = 0;
    const s0 = start + f * SAMPLES_PER_FRAME;
    for (let i = 0; i < SAMPLES_PER_FRAME; i++) acc += pcm[s0 + i] * pcm[s0 + i];
    const rms = Math.sqrt(acc / SAMPLES_PER_FRAME);
    out[f] = Math.fround(20.0 * Math.log10(Math.max(rms, floor)));
  }
  return out;
}

/** SilenceDetector.mask_from_levels: quiet frames, runs shorter than minSilentFrames kept as speech. */
export function silentMask(levels, thresholdDbfs, minSilentFrames) {
  const n = levels.length;
  const mask = new Uint8Array(n);
  const threshold = Math.fround(thresholdDbfs); // numpy compares the float32 levels with a float32 threshold
  for (let i = 0; i < n; i++) mask[i] = levels[i] < threshold ? 1 : 0;
  if (minSilentFrames <= 1) return mask;
  let i = 0;
  while (i < n) {
    if (!mask[i]) { i++; continue; }
    let j = i;
    while (j < n && mask[j]) j++;
    if (j - i < minSilentFrames) mask.fill(0, i, j);
    i = j;
  }
  return mask;
}

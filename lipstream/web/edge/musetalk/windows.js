// MuseTalk's feature windowing around the Whisper encoder graph (lipstream/engines/musetalk/features.py):
// stacked states [steps, S, D] at 50 Hz; video frame f reads steps [2f-4, 2f+6), zeros outside the audio,
// flattened time-major to 10*S*D values.

export const STEPS_PER_FRAME = 2;
export const WINDOW_STEPS = 10;
export const WINDOW_START = -4;
export const LOOKAHEAD_FRAMES = 2;
export const SAMPLES_PER_STEP = 320;

export const encoderSteps = (samples) => Math.floor(Math.max(0, samples) / SAMPLES_PER_STEP);

/** Windows [nFrames, 10*S*D] of frames first.. from states (Float32Array [held*S*D]) holding steps
 * [offset, offset + held); steps outside [0, totalSteps) are zeros. */
export function frameWindows(states, stepSize, first, nFrames, totalSteps, offset = 0) {
  const held = states.length / stepSize;
  const out = new Float32Array(nFrames * WINDOW_STEPS * stepSize);
  for (let f = 0; f < nFrames; f++) {
    const start = STEPS_PER_FRAME * (first + f) + WINDOW_START;
    for (let w = 0; w < WINDOW_STEPS; w++) {
      const step = start + w;
      if (step < 0 || step >= totalSteps) continue;
      const local = step - offset;
      if (local < 0 || local >= held) throw new Error(`frame ${first + f} needs step ${step}, not held`);
      out.set(states.subarray(local * stepSize, (local + 1) * stepSize), (f * WINDOW_STEPS + w) * stepSize);
    }
  }
  return out;
}

// Node (no browser): the MuseTalk page engine's feature windowing (lipstream/web/edge/musetalk/windows.js) on
// stacked states made by tests/test_musetalk_windows_js_parity.py. stdin: JSON {calls: [{states (flat),
// stepSize, first, nFrames, totalSteps, offset} | {samples}]}; stdout: one JSON line, a result per call
// ({windows} or {error}; {steps} for a samples call) and the module's constants.
import { readFileSync } from 'node:fs';
import * as windows from '../../lipstream/web/edge/musetalk/windows.js';

const { calls } = JSON.parse(readFileSync(0, 'utf8'));
const results = calls.map((c) => {
  if ('samples' in c) return { steps: windows.encoderSteps(c.samples) };
  try {
    const out = windows.frameWindows(Float32Array.from(c.states), c.stepSize, c.first, c.nFrames, c.totalSteps, c.offset);
    return { windows: Array.from(out) };
  } catch (err) {
    return { error: String(err.message) };
  }
});
const { STEPS_PER_FRAME, WINDOW_STEPS, WINDOW_START, LOOKAHEAD_FRAMES, SAMPLES_PER_STEP } = windows;
console.log(JSON.stringify({ results, constants: { STEPS_PER_FRAME, WINDOW_STEPS, WINDOW_START, LOOKAHEAD_FRAMES, SAMPLES_PER_STEP } }));

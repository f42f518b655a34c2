// Node (no browser): the page's phrase-end blinks and lid drawing (lipstream/web/edge/lids.js) on inputs the Python
// side made, for tests/test_lids_js_parity.py.
// stdin: JSON {machines: [{loopLength, drawnStarts, fps, phrase, lid, steps: [[frame, voiced, position], ...]}],
//   curves: [{durationFrames, closeShare, shutShare}], chances: [frame, ...],
//   close: [{width, height, rgba: base64 RGBA bytes, points: [72 numbers], closure, lid}],
//   rects: [{points, lid, width, height}]}
// stdout: one JSON line {machines: [[closure, ...]], starts: [[frame, ...]], curves: [[...]], chances: [...],
//   close: [base64 RGBA], rects: [[x0, y0, x1, y1] | null]}.
import { readFileSync } from 'node:fs';
import { blinkCurve, closeEyes, lidRect, phraseChance, PhraseEndBlinks } from '../../lipstream/web/edge/lids.js';

const req = JSON.parse(readFileSync(0, 'utf8'));

const machines = [];
const starts = [];
for (const m of req.machines || []) {
  const machine = new PhraseEndBlinks(m);
  const closures = [];
  const began = [];
  for (const [frame, voiced, position] of m.steps) {
    closures.push(machine.step(frame, voiced, position));
    if (machine.started === frame) began.push(frame); // what main.js flags on the patch
  }
  machines.push(closures);
  starts.push(began);
}

const close = (req.close || []).map(({ width, height, rgba, points, closure, lid }) => {
  const data = new Uint8ClampedArray(Buffer.from(rgba, 'base64'));
  const out = closeEyes({ width, height, data }, points, closure, lid);
  return Buffer.from(out.data.buffer, out.data.byteOffset, out.data.byteLength).toString('base64');
});

console.log(JSON.stringify({
  machines,
  starts,
  curves: (req.curves || []).map(({ durationFrames, closeShare, shutShare }) =>
    Array.from(blinkCurve(durationFrames, closeShare, shutShare))),
  chances: (req.chances || []).map(phraseChance),
  close,
  rects: (req.rects || []).map(({ points, lid, width, height }) => lidRect(points, lid, width, height)),
}));

// Node (no browser): the MuseTalk page engine's patch scheduler (lipstream/web/edge/musetalk/scheduler.js)
// driven like tests/test_musetalk_scheduler_js_parity.py drives lipstream/render/accel.py's PatchScheduler,
// with the same stand-in engine (a patch generated from an FNV-1a hash of the feature row's float32 bytes
// and the source frame), so no ONNX is needed.
// stdin: JSON {scenarios: [{dim, patchSize, codebook: null | {hyperplanes, bits, maxEntries, threshold},
//   masks, steps: [{op: 'push', features (flat), skip, ids} | {op: 'finish'}]}]}
// stdout: one JSON line {scenarios: [{steps: [{released, plan, renders, stats}], codebook}]}.
import { readFileSync } from 'node:fs';
import { SimHashCodebook } from '../../lipstream/web/edge/musetalk/codebook.js';
import { PatchScheduler } from '../../lipstream/web/edge/musetalk/scheduler.js';

/** FNV-1a (32 bit) of a Float32Array's bytes, mixed with the source frame: the stand-in engine's seed. */
function seedOf(row, sourceFrame) {
  const bytes = new Uint8Array(row.buffer, row.byteOffset, row.byteLength);
  let h = 0x811c9dc5;
  for (const b of bytes) h = Math.imul(h ^ b, 0x01000193) >>> 0;
  return (h ^ Math.imul(sourceFrame, 0x9e3779b1)) >>> 0;
}

/** The stand-in engine's patch: RGB bytes from a 32-bit LCG seeded by seedOf, packed as RGBA words. */
function standInPatch(row, sourceFrame, size) {
  let h = seedOf(row, sourceFrame);
  const words = new Uint32Array(size * size);
  for (let p = 0; p < words.length; p++) {
    const rgb = [];
    for (let c = 0; c < 3; c++) {
      h = (Math.imul(h, 1664525) + 1013904223) >>> 0;
      rgb.push(h >>> 24);
    }
    words[p] = (0xff000000 | (rgb[2] << 16) | (rgb[1] << 8) | rgb[0]) >>> 0;
  }
  return words;
}

/** The stand-in mouth mask of a source frame (the same formula as the Python test), or null for none. */
function maskOf(sourceFrame, size) {
  const alpha = new Uint8Array(size * size);
  for (let p = 0; p < alpha.length; p++) alpha[p] = (p * 7 + sourceFrame * 13) % 5 === 0 ? 0 : ((p * 31 + sourceFrame * 17) % 255) + 1;
  return alpha;
}

async function runScenario(sc) {
  const { dim, patchSize } = sc;
  let renders = [];
  let codebook = null;
  if (sc.codebook) {
    const { hyperplanes, bits, maxEntries, threshold } = sc.codebook;
    codebook = new SimHashCodebook({ dim, bits, hyperplanes: Float32Array.from(hyperplanes), maxEntries, threshold, patchWords: patchSize * patchSize });
  }
  const scheduler = new PatchScheduler({
    dim, codebook, patchWords: patchSize * patchSize,
    render: async (items) => {
      renders.push(items.map((it) => [seedOf(it.features, it.sourceFrame), it.sourceFrame]));
      return items.map((it) => standInPatch(it.features, it.sourceFrame, patchSize));
    },
    alphaFor: async (f) => (sc.masks ? maskOf(f, patchSize) : null),
  });
  const steps = [];
  for (const step of sc.steps) {
    const planner = scheduler.planner;
    let plan = [];
    for (const name of ['plan', 'finish']) {
      const original = Object.getPrototypeOf(planner)[name].bind(planner); // not an earlier step's wrapper
      planner[name] = (...args) => { const out = original(...args); plan = plan.concat(out); return out; };
    }
    renders = [];
    const released = step.op === 'push'
      ? await scheduler.push(Float32Array.from(step.features), Uint8Array.from(step.skip), step.ids)
      : await scheduler.finish();
    steps.push({
      released: released.map((r) => ({ index: r.index, sourceFrame: r.sourceFrame, kind: r.kind, patch: r.patch ? Array.from(r.patch) : null })),
      plan: plan.map((d) => [d.index, d.kind, d.left, d.right, d.weight]),
      renders,
      stats: { ...scheduler.stats },
    });
  }
  const book = codebook && { size: codebook.size, hits: codebook.hits, misses: codebook.misses, evictions: codebook.evictions,
    codes: Array.from({ length: codebook.size }, (_, e) => [codebook.codes[2 * e], codebook.codes[2 * e + 1]]) };
  return { steps, codebook: book };
}

const { scenarios } = JSON.parse(readFileSync(0, 'utf8'));
const results = [];
for (const sc of scenarios) results.push(await runScenario(sc));
console.log(JSON.stringify({ scenarios: results }));

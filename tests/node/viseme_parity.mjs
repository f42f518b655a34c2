// Node (no browser): one stage of the page's weight-free engine (lipstream/web/edge/viseme/*.js) at a time, on
// inputs made by tests/test_viseme_js_parity.py, which runs the Python stage on the same inputs.
// stdin: JSON {params: engine.json's parameters, calls: [{stage, ...arguments}]}; stdout: one JSON line, the
// list of results (typed arrays as plain lists).
import { readFileSync } from 'node:fs';
import { AcousticFrontEnd } from '../../lipstream/web/edge/viseme/acoustic.js';
import { interp, warpOpening } from '../../lipstream/web/edge/viseme/calibration.js';
import { ArticulationExtractor, StreamingArticulation } from '../../lipstream/web/edge/viseme/extractor.js';
import { createFft, powerSpectrum } from '../../lipstream/web/edge/viseme/fft.js';
import { frameRms, silentMask } from '../../lipstream/web/edge/viseme/levels.js';
import { easeToRest, gateClosures, loudness, scaleOpening } from '../../lipstream/web/edge/viseme/loudness.js';
import { ArticulationModel } from '../../lipstream/web/edge/viseme/model.js';
import { interpContour, unpackGeometry } from '../../lipstream/web/edge/viseme/warp.js';

const { params, calls } = JSON.parse(readFileSync(0, 'utf8'));
const list = (a) => Array.from(a);
const f32 = (a) => Float32Array.from(a);

const stages = {
  fft: ({ x, n }) => {
    const out = new Float64Array(n / 2 + 1);
    return list(powerSpectrum(createFft(n), Float64Array.from(x), out));
  },
  window: () => list(new AcousticFrontEnd(params.acoustic).window),
  melFilterbank: () => new AcousticFrontEnd(params.acoustic).fb.map(list),
  acoustic: ({ pcm, first, n }) => list(new AcousticFrontEnd(params.acoustic).frames(f32(pcm), first, n)),
  frameRms: ({ pcm, start, end }) => list(frameRms(f32(pcm), start, end)),
  silentMask: ({ levels, threshold, min }) => list(silentMask(levels, threshold, min)),
  model: ({ acoustic, dim }) => list(new ArticulationModel(params.model).predict(Float64Array.from(acoustic), dim)),
  smooth: ({ raw, k0, k1 }) => {
    // span() with the model's output given and finish() as the identity: only the smoothing runs
    const ex = new ArticulationExtractor(params);
    ex.model.predict = () => Float64Array.from(raw);
    ex.finish = (pcm, feats) => feats;
    return list(ex.span(new Float32Array(0), k0, k1, k1));
  },
  loudness: ({ levels }) => list(loudness(levels, params.loudness)),
  gate: ({ feats, loud }) => list(gateClosures(Float64Array.from(feats), loud, params.closure_gate)),
  scale: ({ feats, loud }) => list(scaleOpening(Float64Array.from(feats), loud, params.loudness)),
  ease: ({ feats, silent }) => list(easeToRest(Float64Array.from(feats), Uint8Array.from(silent), params.loudness)),
  finish: ({ pcm, feats, k0, k1, known, offset }) =>
    list(new ArticulationExtractor(params).finish(f32(pcm), Float64Array.from(feats), k0, k1, known, offset)),
  span: ({ pcm, k0, k1, known, offset }) => list(new ArticulationExtractor(params).span(f32(pcm), k0, k1, known, offset)),
  stream: ({ pcm, chunks }) => {
    const stream = new StreamingArticulation(new ArticulationExtractor(params));
    const out = [];
    let at = 0;
    for (const size of chunks) {
      const { first, rows } = stream.push(f32(pcm.slice(at, at + size)));
      at += size;
      out.push({ first, rows: list(rows) });
    }
    const { first, rows } = stream.finish();
    out.push({ first, rows: list(rows) });
    return out;
  },
  warpOpening: ({ curve, commands }) => commands.map((c) => warpOpening(curve, c)),
  interp: ({ xs, xp, fp }) => xs.map((x) => interp(x, xp, fp)),
  unpackGeometry: ({ row }) => unpackGeometry(row),
  interpContour: ({ contour, xs }) => list(interpContour(contour, xs)),
};

console.log(JSON.stringify(calls.map(({ stage, ...args }) => {
  if (!(stage in stages)) throw new Error(`unknown stage ${stage}`);
  return stages[stage](args);
})));

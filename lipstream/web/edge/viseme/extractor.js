// Port of lipstream/engines/viseme/extractor.py (audio-only path): acoustic model -> smoothing -> loudness,
// closure gate, easing into rest; and the streaming wrapper that emits rows once they are final.
import { AcousticFrontEnd, SAMPLES_PER_FRAME } from './acoustic.js';
import { ArticulationModel } from './model.js';
import { frameRms, silentMask } from './levels.js';
import { easeToRest, gateClosures, loudness, scaleOpening } from './loudness.js';

export class ArticulationExtractor {
  /** params: engine.json (model, acoustic, smooth, silence, loudness, closure_gate, ...). */
  constructor(params) {
    this.model = new ArticulationModel(params.model);
    this.frontEnd = new AcousticFrontEnd(params.acoustic);
    this.smooth = params.smooth;
    this.silence = params.silence;
    this.loud = params.loudness;
    this.gate = params.closure_gate;
  }

  get lookaheadFrames() {
    return Math.max(this.model.after + 2, this.silence.min_silent_frames - 1 + this.loud.ease_frames);
  }

  get lookbackFrames() {
    return Math.max(this.model.before + 2, this.silence.min_silent_frames - 1, this.loud.back_frames);
  }

  /** span: rows for frames [k0, k1) (Float64Array [(k1-k0)*3]); pcm starts at frame offsetFrames. */
  span(pcm, k0, k1, framesKnown, offsetFrames = 0) {
    if (k1 <= k0) return new Float64Array(0);
    const m = this.model;
    const a0 = k0 - 1 - m.before;
    const a1 = k1 + 1 + m.after;
    const acoustic = this.frontEnd.frames(pcm, a0 - offsetFrames, a1 - a0);
    const raw = m.predict(acoustic, this.frontEnd.dim); // rows for k0-1 .. k1
    const n = k1 - k0;
    const [s0, s1, s2] = this.smooth;
    const smooth = new Float64Array(n * 3);
    for (let i = 0; i < n; i++) {
      for (let c = 0; c < 3; c++) {
        smooth[i * 3 + c] = Math.fround(s0 * raw[i * 3 + c] + s1 * raw[(i + 1) * 3 + c] + s2 * raw[(i + 2) * 3 + c]);
      }
    }
    return this.finish(pcm, smooth, k0, k1, framesKnown, offsetFrames);
  }

  /** _finish: gate closures, scale the opening by loudness, ease into rest, zero silent rows. */
  finish(pcm, feats, k0, k1, framesKnown, offsetFrames = 0) {
    const e = this.loud.ease_frames;
    const pad = this.silence.min_silent_frames - 1 + e;
    const l0 = Math.max(k0 - Math.max(pad, this.loud.back_frames), offsetFrames, 0);
    const l1 = Math.min(k1 + Math.max(pad, this.loud.ahead_frames), framesKnown);
    const s0 = (l0 - offsetFrames) * SAMPLES_PER_FRAME;
    const s1 = Math.min((l1 - offsetFrames) * SAMPLES_PER_FRAME, pcm.length);
    const levels = frameRms(pcm, s0, s1);
    const r0 = k0 - l0;
    const n = k1 - k0;
    const loudAll = loudness(levels, this.loud);
    const loud = loudAll.subarray(r0, r0 + n);
    const gated = gateClosures(feats, loud, this.gate);
    const scaled = scaleOpening(gated, loud, this.loud);
    const mask = silentMask(levels, this.silence.threshold_dbfs, this.silence.min_silent_frames);
    const padded = new Uint8Array(mask.length + 2 * e);
    padded.set(mask, e);
    return easeToRest(scaled, padded.subarray(r0, r0 + n + 2 * e), this.loud);
  }
}

/** StreamingArticulation: push 16 kHz PCM, get the rows that became final (at most lookahead frames late). */
export class StreamingArticulation {
  constructor(extractor) {
    this.ex = extractor;
    this.buffer = new Float32Array(0);
    this.offsetFrames = 0;
    this.totalSamples = 0;
    this.done = 0;
  }

  /** Rows {first, rows: Float64Array} for frames that became final. */
  push(pcm) {
    const grown = new Float32Array(this.buffer.length + pcm.length);
    grown.set(this.buffer);
    grown.set(pcm, this.buffer.length);
    this.buffer = grown;
    this.totalSamples += pcm.length;
    const known = Math.floor(this.totalSamples / SAMPLES_PER_FRAME);
    const ready = known - this.ex.lookaheadFrames;
    if (ready <= this.done) return { first: this.done, rows: new Float64Array(0) };
    return this.emit(ready, known);
  }

  finish() {
    const known = Math.floor(this.totalSamples / SAMPLES_PER_FRAME);
    return this.emit(known, known);
  }

  emit(upto, known) {
    const first = this.done;
    if (upto <= this.done) return { first, rows: new Float64Array(0) };
    const rows = this.ex.span(this.buffer, this.done, upto, known, this.offsetFrames);
    this.done = upto;
    const keepFrom = Math.max(this.done - this.ex.lookbackFrames - 1, 0);
    const drop = keepFrom - this.offsetFrames;
    if (drop > 0) {
      this.buffer = this.buffer.slice(drop * SAMPLES_PER_FRAME);
      this.offsetFrames = keepFrom;
    }
    return { first, rows };
  }
}

// Where each frame's patch comes from (lipstream/render/accel.py's PatchScheduler): silence, the
// codebook, the engine, or a cross-fade. Push frames in time order; every frame whose patch is decided
// comes back in order (infill frames wait for their right-hand keyframe, at most slowStride frames).

import { INFILL, KEYFRAME, KeyframePlanner, SILENT } from './planner.js';
import { hamming } from './codebook.js';
import { crossfade, withAlpha } from './pixels.js';

export class PatchScheduler {
  /** render(items [{features, sourceFrame}]) -> Promise<Uint32Array[]> (RGBA words, alpha = that frame's mask);
   * alphaFor(sourceFrame) -> Promise<Uint8Array|null>; codebook may be null (off). */
  constructor({ dim, render, alphaFor, codebook = null, planner = {}, timer = null, patchWords = 256 * 256 }) {
    Object.assign(this, { dim, render, alphaFor, codebook, timer, patchWords });
    this.plannerConfig = planner;
    this.planner = new KeyframePlanner(planner);
    this.pending = new Map();
    this.keys = new Map();
    this.next = 0;
    this.stats = { frames: 0, silentFrames: 0, keyframes: 0, codebookHits: 0, neuralFrames: 0, infillFrames: 0 };
  }

  /** Add frames: features Float32Array [n*dim], skip Uint8Array [n] (silent, after the speaking margin),
   * sourceIds [n]; resolves to [{index, sourceFrame, patch (Uint32Array) or null, kind}] now decided. */
  async push(features, skip, sourceIds) {
    const n = skip.length;
    const start = this.next;
    for (let i = 0; i < n; i++) this.pending.set(start + i, { features: features.subarray(i * this.dim, (i + 1) * this.dim), sourceFrame: sourceIds[i] });
    this.next += n;
    const t0 = performance.now();
    const plan = this.planner.plan(features, this.dim, skip);
    this._time('planner', t0);
    return this._release(plan);
  }

  /** End of the utterance: release every held-back frame; the planner starts afresh (threshold kept). */
  async finish() {
    const out = await this._release(this.planner.finish());
    this.reset();
    return out;
  }

  reset() {
    this.planner = new KeyframePlanner({ ...this.plannerConfig, velocityThreshold: this.planner.config.velocityThreshold });
    this.pending.clear();
    this.keys.clear();
    this.next = 0;
  }

  async _keyframePatches(indices) {
    const misses = [];
    const aliases = new Map();
    const codes = new Map();
    if (this.codebook && indices.length) {
      const t0 = performance.now();
      const vectors = new Float32Array(indices.length * this.dim);
      indices.forEach((i, k) => vectors.set(this.pending.get(i).features, k * this.dim));
      const hashed = this.codebook.hash(vectors);
      const missCodes = [];
      indices.forEach((i, k) => {
        const lo = hashed[2 * k], hi = hashed[2 * k + 1];
        codes.set(i, [lo, hi]);
        const found = this.codebook.lookup(lo, hi);
        if (found.patch) { this.keys.set(i, found.patch); this.stats.codebookHits++; return; }
        let best = -1, bestD = Infinity;
        missCodes.forEach(([l, h], j) => { const d = hamming(lo, hi, l, h); if (d < bestD) { bestD = d; best = j; } });
        if (best >= 0 && bestD <= this.codebook.threshold) { aliases.set(i, misses[best]); this.stats.codebookHits++; return; }
        misses.push(i);
        missCodes.push([lo, hi]);
      });
      this._time('codebook', t0);
    } else misses.push(...indices);
    if (misses.length) {
      const rendered = await this.render(misses.map((i) => this.pending.get(i)));
      this.stats.neuralFrames += misses.length;
      misses.forEach((i, k) => {
        this.keys.set(i, rendered[k]);
        if (this.codebook) this.codebook.insert(codes.get(i)[0], codes.get(i)[1], rendered[k]);
      });
    }
    for (const [i, source] of aliases) this.keys.set(i, this.keys.get(source));
  }

  async _release(plan) {
    const keys = plan.filter((d) => d.kind === KEYFRAME).map((d) => d.index);
    this.stats.keyframes += keys.length;
    await this._keyframePatches(keys);
    const out = [];
    for (const d of plan) {
      const frame = this.pending.get(d.index);
      this.pending.delete(d.index);
      this.stats.frames++;
      if (d.kind === SILENT) {
        this.stats.silentFrames++;
        out.push({ index: d.index, sourceFrame: frame.sourceFrame, patch: null, kind: d.kind });
        continue;
      }
      const alpha = await this.alphaFor(frame.sourceFrame);
      const patch = new Uint32Array(this.patchWords);
      const t0 = performance.now();
      if (d.kind === KEYFRAME) withAlpha(this.keys.get(d.index), alpha, patch);
      else if (d.kind === INFILL) {
        this.stats.infillFrames++;
        crossfade(this.keys.get(d.left), this.keys.get(d.right), d.weight, alpha, patch);
      }
      this._time(d.kind === INFILL ? 'infill' : 'alpha', t0);
      out.push({ index: d.index, sourceFrame: frame.sourceFrame, patch, kind: d.kind });
    }
    if (this.keys.size) { // only the latest keyframe can be the left neighbour of frames still to come
      const latest = Math.max(...this.keys.keys());
      const patch = this.keys.get(latest);
      this.keys.clear();
      this.keys.set(latest, patch);
    }
    return out;
  }

  _time(stage, t0) { if (this.timer) this.timer.add(stage, performance.now() - t0); }
}

// Keyframes by acoustic velocity: a port of lipstream/render/planner.py (KeyframePlanner) with the same
// defaults (fast stride 2, slow stride 4, threshold = 0.7 quantile of voiced velocities, calibrated on
// the first chunk with >= 25 voiced frames). Decisions are emitted once final, in frame order.

export const SILENT = 0;
export const KEYFRAME = 1;
export const INFILL = 2;

export const DEFAULT_PLANNER = Object.freeze({
  fastStride: 2, slowStride: 4, velocityThreshold: null, calibrationQuantile: 0.7, minCalibrationFrames: 25,
});

/** Mean absolute change of each row from the previous one ([T]; Infinity for the first without `previous`). */
export function acousticVelocity(features, dim, previous = null) {
  const n = features.length / dim;
  const out = new Float32Array(n);
  for (let t = 0; t < n; t++) {
    const prev = t === 0 ? previous : features.subarray((t - 1) * dim, t * dim);
    if (!prev) { out[t] = Infinity; continue; }
    const row = features.subarray(t * dim, (t + 1) * dim);
    let acc = 0;
    for (let i = 0; i < dim; i++) acc += Math.abs(Math.fround(row[i] - prev[i]));
    out[t] = acc / dim;
  }
  return out;
}

/** numpy's default (linear) quantile. */
export function quantile(values, q) {
  const sorted = Float64Array.from(values).sort();
  const pos = q * (sorted.length - 1);
  const lo = Math.floor(pos);
  const hi = Math.min(lo + 1, sorted.length - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

export class KeyframePlanner {
  constructor(config = {}) {
    this.config = { ...DEFAULT_PLANNER, ...config };
    if (this.config.fastStride > this.config.slowStride) throw new Error('fastStride must be <= slowStride');
    this.nextIndex = 0;
    this.previous = null;
    this.lastKey = null;
    this.maxVelocity = 0;
    this.pending = [];
  }

  /** Threshold = the configured quantile of the voiced frames' velocities. */
  calibrate(features, dim, silent = null) {
    const velocity = acousticVelocity(features, dim);
    const kept = [];
    for (let t = 1; t < velocity.length; t++) {
      if (silent && (silent[t] || silent[t - 1])) continue;
      if (Number.isFinite(velocity[t])) kept.push(velocity[t]);
    }
    if (!kept.length) throw new Error('calibration needs at least two consecutive voiced frames');
    this.config.velocityThreshold = quantile(kept, this.config.calibrationQuantile);
    return this.config.velocityThreshold;
  }

  /** Add frames (features [T*dim], silent [T]); return the decisions that became final. */
  plan(features, dim, silent) {
    const n = silent.length;
    let voiced = 0;
    for (let i = 0; i < n; i++) voiced += silent[i] ? 0 : 1;
    if (this.config.velocityThreshold === null && voiced >= this.config.minCalibrationFrames) {
      try { this.calibrate(features, dim, silent); } catch { /* voiced frames all isolated: wait */ }
    }
    const velocity = acousticVelocity(features, dim, this.previous);
    const out = [];
    const threshold = this.config.velocityThreshold;
    for (let i = 0; i < n; i++) {
      const index = this.nextIndex + i;
      if (silent[i]) {
        this._closeRun(out);
        out.push({ index, kind: SILENT, left: index, right: index, weight: 0 });
        continue;
      }
      if (this.lastKey === null) { this._takeKey(index, out); continue; }
      this.maxVelocity = Math.max(this.maxVelocity, velocity[i]);
      this.pending.push(index);
      const gap = index - this.lastKey;
      const fast = threshold !== null && this.maxVelocity >= threshold;
      if (gap >= (fast ? this.config.fastStride : this.config.slowStride)) {
        this.pending.pop();
        this._takeKey(index, out);
      }
    }
    this.nextIndex += n;
    if (n) this.previous = features.slice((n - 1) * dim, n * dim);
    return out.sort((a, b) => a.index - b.index);
  }

  /** End of stream: the last voiced frame becomes a keyframe; every remaining decision. */
  finish() {
    const out = [];
    this._closeRun(out);
    this.previous = null;
    return out.sort((a, b) => a.index - b.index);
  }

  _takeKey(index, out) {
    if (this.pending.length && this.lastKey !== null) {
      const left = this.lastKey, span = index - left;
      for (const frame of this.pending) out.push({ index: frame, kind: INFILL, left, right: index, weight: (frame - left) / span });
    }
    this.pending = [];
    out.push({ index, kind: KEYFRAME, left: index, right: index, weight: 0 });
    this.lastKey = index;
    this.maxVelocity = 0;
  }

  _closeRun(out) {
    if (this.pending.length) this._takeKey(this.pending.pop(), out);
    this.lastKey = null;
    this.maxVelocity = 0;
  }
}

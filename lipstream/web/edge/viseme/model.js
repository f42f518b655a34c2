// Port of lipstream/engines/viseme/model.py: the MLP over a window of acoustic frames -> (open, width, closure).

export class ArticulationModel {
  /** params: engine.json's "model" ({before, after, mean, std, weights: [{rows, cols, data}], biases}). */
  constructor(params) {
    this.before = params.before;
    this.after = params.after;
    this.mean = Float32Array.from(params.mean);
    this.std = Float32Array.from(params.std);
    this.weights = params.weights.map((w) => ({ rows: w.rows, cols: w.cols, data: Float32Array.from(w.data) }));
    this.biases = params.biases.map((b) => Float32Array.from(b));
  }

  get context() { return this.before + 1 + this.after; }

  /** Articulation Float64Array [n*3] for acoustic rows [n + before + after][dim] (flat). */
  predict(acoustic, dim) {
    const rows = acoustic.length / dim;
    const n = rows - this.before - this.after;
    if (n <= 0) return new Float64Array(0);
    const out = new Float64Array(n * 3);
    const inDim = this.context * dim;
    let h = new Float64Array(inDim);
    for (let i = 0; i < n; i++) {
      // rows i .. i+context-1 stacked: input index t*dim + j
      for (let t = 0; t < this.context; t++) {
        for (let j = 0; j < dim; j++) {
          const idx = t * dim + j;
          h[idx] = (acoustic[(i + t) * dim + j] - this.mean[idx]) / this.std[idx];
        }
      }
      let x = h;
      for (let l = 0; l < this.weights.length; l++) {
        const { rows: R, cols: C, data } = this.weights[l];
        const b = this.biases[l];
        const z = new Float64Array(C);
        for (let c = 0; c < C; c++) z[c] = b[c];
        for (let r = 0; r < R; r++) {
          const xr = x[r];
          if (xr === 0) continue;
          const base = r * C;
          for (let c = 0; c < C; c++) z[c] += xr * data[base + c];
        }
        if (l < this.weights.length - 1) for (let c = 0; c < C; c++) z[c] = Math.tanh(z[c]);
        x = z;
      }
      out[i * 3] = 1 / (1 + Math.exp(-x[0]));
      out[i * 3 + 1] = Math.tanh(x[1]);
      out[i * 3 + 2] = 1 / (1 + Math.exp(-x[2]));
    }
    return out;
  }
}

// Port of lipstream/engines/viseme/acoustic.py: per-40 ms-frame log-mel shape + level + level change.
import { createFft, powerSpectrum } from './fft.js';

export const SAMPLE_RATE = 16000;
export const SAMPLES_PER_FRAME = 640;

/** _mel_filterbank: triangular filters [nMels][nFft/2+1] on the HTK mel scale. */
export function melFilterbank(nMels, nFft, rate, fmin, fmax) {
  const toMel = (f) => 2595.0 * Math.log10(1.0 + f / 700.0);
  const toHz = (m) => 700.0 * (10.0 ** (m / 2595.0) - 1.0);
  const mlo = toMel(fmin);
  const mhi = toMel(fmax);
  const edges = [];
  for (let i = 0; i < nMels + 2; i++) edges.push(toHz(mlo + ((mhi - mlo) * i) / (nMels + 1)));
  const nBins = nFft / 2 + 1;
  const fb = [];
  for (let i = 0; i < nMels; i++) {
    const row = new Float32Array(nBins);
    const [lo, mid, hi] = [edges[i], edges[i + 1], edges[i + 2]];
    for (let k = 0; k < nBins; k++) {
      const f = (k * rate) / nFft;
      row[k] = Math.max(Math.min((f - lo) / (mid - lo), (hi - f) / (hi - mid)), 0.0);
    }
    fb.push(row);
  }
  return fb;
}

/** AcousticFrontEnd: frames(pcm, firstFrame, nFrames) -> Float64Array [nFrames * dim]. */
export class AcousticFrontEnd {
  constructor(cfg) {
    this.cfg = cfg; // {n_mels, fmin, fmax, hop, window, n_fft, energy_floor}
    this.fb = melFilterbank(cfg.n_mels, cfg.n_fft, SAMPLE_RATE, cfg.fmin, cfg.fmax);
    this.window = new Float32Array(cfg.window);
    for (let i = 0; i < cfg.window; i++) this.window[i] = 0.5 - 0.5 * Math.cos((2 * Math.PI * i) / (cfg.window - 1));
    this.fft = createFft(cfg.n_fft);
    this.frame = new Float32Array(cfg.window);
    this.power = new Float64Array(cfg.n_fft / 2 + 1);
  }

  get dim() { return this.cfg.n_mels + 2; }

  frames(pcm, firstFrame, nFrames) {
    const { hop: HOP, window: WINDOW, n_mels: M, energy_floor: FLOOR } = this.cfg;
    const dim = this.dim;
    const out = new Float64Array(Math.max(nFrames, 0) * dim);
    if (nFrames <= 0) return out;
    const hop0 = firstFrame * 4 - 1;
    const nHops = nFrames * 4 + 1;
    const lo = hop0 * HOP + (HOP >> 1) - (WINDOW >> 1);
    const logmel = new Float64Array(nHops * M);
    const level = new Float64Array(nHops);
    const nBins = this.power.length;
    for (let h = 0; h < nHops; h++) {
      const start = lo + h * HOP; // first sample of this hop's window, in pcm
      let energy = 0;
      for (let j = 0; j < WINDOW; j++) {
        const s = start + j;
        const v = s >= 0 && s < pcm.length ? pcm[s] : 0;
        energy += v * v;
        this.frame[j] = v * this.window[j];
      }
      level[h] = Math.log10(energy / WINDOW + FLOOR);
      powerSpectrum(this.fft, this.frame, this.power);
      for (let m = 0; m < M; m++) {
        const fb = this.fb[m];
        let acc = 0;
        for (let k = 0; k < nBins; k++) acc += this.power[k] * fb[k];
        logmel[h * M + m] = Math.log10(acc + FLOOR);
      }
    }
    for (let f = 0; f < nFrames; f++) {
      const row = f * dim;
      let levelSum = 0;
      for (let q = 0; q < 4; q++) {
        const h = 1 + f * 4 + q;
        let mean = 0;
        for (let m = 0; m < M; m++) mean += logmel[h * M + m];
        mean /= M;
        for (let m = 0; m < M; m++) out[row + m] += (logmel[h * M + m] - mean) / 4;
        levelSum += level[h];
      }
      out[row + M] = levelSum / 4;
      const prevLast = f === 0 ? level[0] : level[f * 4];
      out[row + M + 1] = level[f * 4 + 4] - prevLast;
    }
    return out;
  }
}

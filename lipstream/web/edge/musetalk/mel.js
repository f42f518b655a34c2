// Whisper log-mel features, computed as transformers' WhisperFeatureExtractor does (the Python engine's
// extractor, lipstream/engines/musetalk/features.py): 16 kHz audio zero-padded to 30 s, centred frames
// (reflect padding of n_fft/2), periodic Hann window of 400, |FFT|^2 with the FFT stored as complex64,
// slaney mel filters (80 bins, 0-8 kHz), log10 of max(1e-10, .), the last frame dropped, floored at
// max - 8 and mapped by (x + 4) / 4. float32 roundings are reproduced where numpy makes them.

export const SAMPLE_RATE = 16000;
export const N_FFT = 400;
export const HOP = 160;
export const N_MELS = 80;
export const SEGMENT_SAMPLES = 30 * SAMPLE_RATE;
export const N_FRAMES = SEGMENT_SAMPLES / HOP; // 3000 mel frames per 30 s segment
const N_BINS = N_FFT / 2 + 1;

function hertzToMel(freq) {
  // slaney scale: linear below 1 kHz, logarithmic above
  if (freq < 1000) return (3 * freq) / 200;
  return 15 + Math.log(freq / 1000) * (27 / Math.log(6.4));
}

function melToHertz(mel) {
  if (mel < 15) return (200 * mel) / 3;
  return 1000 * Math.exp((Math.log(6.4) / 27) * (mel - 15));
}

/** Slaney-normalised triangular filters, [nBins][nMels] as a flat Float64Array (transformers' layout). */
export function melFilters(nMels = N_MELS, nFft = N_FFT, sampleRate = SAMPLE_RATE, fmax = 8000) {
  const nBins = nFft / 2 + 1;
  const melMax = hertzToMel(fmax);
  const filterFreqs = new Float64Array(nMels + 2);
  for (let i = 0; i < nMels + 2; i++) filterFreqs[i] = melToHertz((melMax * i) / (nMels + 1));
  const out = new Float64Array(nBins * nMels);
  const binWidth = Math.floor(sampleRate / 2) / (nBins - 1);
  for (let b = 0; b < nBins; b++) {
    const f = binWidth * b;
    for (let m = 0; m < nMels; m++) {
      const down = -(filterFreqs[m] - f) / (filterFreqs[m + 1] - filterFreqs[m]);
      const up = (filterFreqs[m + 2] - f) / (filterFreqs[m + 2] - filterFreqs[m + 1]);
      const tri = Math.max(0, Math.min(down, up));
      out[b * nMels + m] = tri * (2 / (filterFreqs[m + 2] - filterFreqs[m]));
    }
  }
  return out;
}

/** Periodic Hann window (numpy's hanning(n + 1) without its last point). */
export function hannWindow(n = N_FFT) {
  const w = new Float64Array(n);
  for (let i = 0; i < n; i++) w[i] = 0.5 - 0.5 * Math.cos((2 * Math.PI * i) / n);
  return w;
}

function factorize(n) {
  const factors = [];
  for (const p of [4, 2, 3, 5]) while (n % p === 0) { factors.push(p); n /= p; }
  for (let p = 7; n > 1; p += 2) while (n % p === 0) { factors.push(p); n /= p; }
  return factors;
}

/** A mixed-radix complex FFT of one size (400 = 4·4·5·5 for Whisper), float64, allocation-free per call. */
export class FFT {
  constructor(n) {
    this.n = n;
    this.factors = factorize(n);
    this.cos = new Float64Array(n);
    this.sin = new Float64Array(n);
    for (let j = 0; j < n; j++) {
      this.cos[j] = Math.cos((2 * Math.PI * j) / n);
      this.sin[j] = -Math.sin((2 * Math.PI * j) / n);
    }
    this.tmpRe = new Float64Array(n);
    this.tmpIm = new Float64Array(n);
  }

  /** Forward transform of (re, im) into (outRe, outIm); inputs are left untouched. */
  transform(re, im, outRe, outIm) {
    this._rec(this.n, 0, re, im, 0, 1, outRe, outIm, 0);
  }

  _rec(n, level, re, im, off, stride, outRe, outIm, outOff) {
    if (n === 1) { outRe[outOff] = re[off]; outIm[outOff] = im[off]; return; }
    const p = this.factors[level];
    const m = n / p;
    for (let r = 0; r < p; r++) this._rec(m, level + 1, re, im, off + r * stride, stride * p, outRe, outIm, outOff + r * m);
    // butterflies: Y[k + q·m] = Σ_r W_n^{r(k + q·m)} · sub_r[k]
    const scale = this.n / n;
    const tRe = this.tmpRe, tIm = this.tmpIm;
    for (let k = 0; k < m; k++) {
      for (let q = 0; q < p; q++) {
        const j = k + q * m;
        let sr = 0, si = 0;
        for (let r = 0; r < p; r++) {
          const idx = ((r * j) % n) * scale;
          const wr = this.cos[idx], wi = this.sin[idx];
          const xr = outRe[outOff + r * m + k], xi = outIm[outOff + r * m + k];
          sr += xr * wr - xi * wi;
          si += xr * wi + xi * wr;
        }
        tRe[j] = sr; tIm[j] = si;
      }
    }
    for (let j = 0; j < n; j++) { outRe[outOff + j] = tRe[j]; outIm[outOff + j] = tIm[j]; }
  }
}

/** Reusable extractor: filters, window and FFT buffers are built once per worker. */
export class LogMelExtractor {
  constructor() {
    this.filters = melFilters();
    this.window = hannWindow();
    this.fft = new FFT(N_FFT);
    this.bufRe = new Float64Array(N_FFT);
    this.bufIm = new Float64Array(N_FFT);
    this.outRe = new Float64Array(N_FFT);
    this.outIm = new Float64Array(N_FFT);
    this.power = new Float64Array(N_BINS);
  }

  /** Log-mel [80][3000] (flat Float32Array, mel-major, as the encoder takes it) of at most 30 s of audio. */
  extract(pcm) {
    if (pcm.length > SEGMENT_SAMPLES) throw new Error(`a Whisper segment holds at most ${SEGMENT_SAMPLES} samples, got ${pcm.length}`);
    const half = N_FFT / 2;
    const total = SEGMENT_SAMPLES; // zero padded to 30 s, then centre (reflect) padded
    const sample = (i) => { // the reflect-padded, zero-padded waveform at index i of [-half, total + half)
      if (i < 0) i = -i;
      else if (i >= total) i = 2 * (total - 1) - i;
      return i < pcm.length ? Math.fround(pcm[i]) : 0;
    };
    const logSpec = new Float32Array(N_MELS * N_FRAMES);
    // frames whose window lies wholly in the zero padding are identical: compute one and copy it
    const silentFrom = Math.ceil((pcm.length + half) / HOP);
    let silentColumn = null;
    let maxValue = -Infinity;
    for (let t = 0; t < N_FRAMES; t++) {
      let column;
      if (t >= silentFrom && silentColumn) column = silentColumn;
      else {
        column = this._frame(sample, t * HOP - half);
        if (t >= silentFrom) silentColumn = column;
      }
      for (let m = 0; m < N_MELS; m++) {
        const v = column[m];
        logSpec[m * N_FRAMES + t] = v;
        if (v > maxValue) maxValue = v;
      }
    }
    // the STFT's 3001st frame is dropped before the maximum is taken, so it is never computed
    const floor = Math.fround(maxValue - 8);
    for (let i = 0; i < logSpec.length; i++) {
      const v = logSpec[i] < floor ? floor : logSpec[i];
      logSpec[i] = Math.fround(Math.fround(v + 4) / 4);
    }
    return logSpec;
  }

  _frame(sample, start) {
    const { bufRe, bufIm, outRe, outIm, power, window, filters } = this;
    for (let i = 0; i < N_FFT; i++) { bufRe[i] = sample(start + i) * window[i]; bufIm[i] = 0; }
    this.fft.transform(bufRe, bufIm, outRe, outIm);
    for (let b = 0; b < N_BINS; b++) {
      const re = Math.fround(outRe[b]), im = Math.fround(outIm[b]); // numpy stores the FFT as complex64
      const mag = Math.hypot(re, im);
      power[b] = mag * mag;
    }
    const column = new Float32Array(N_MELS);
    for (let m = 0; m < N_MELS; m++) {
      let acc = 0;
      for (let b = 0; b < N_BINS; b++) acc += filters[b * N_MELS + m] * power[b];
      column[m] = Math.log10(acc > 1e-10 ? acc : 1e-10);
    }
    return column;
  }
}

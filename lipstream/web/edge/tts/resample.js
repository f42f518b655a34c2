// Band-limited resampling of a whole buffer (Kaiser-windowed sinc), e.g. a Piper voice's 22.05 kHz to the
// engines' 16 kHz. Runs in the TTS worker, where no OfflineAudioContext exists.

const HALF_TAPS = 16; // zero crossings each side of the kernel at the lower rate
const KAISER_BETA = 8.6;

function besselI0(x) {
  let sum = 1, term = 1;
  for (let k = 1; k < 30; k++) { term *= (x / (2 * k)) * (x / (2 * k)); sum += term; }
  return sum;
}

function gcd(a, b) { return b ? gcd(b, a % b) : a; }

/** Float32Array at rateOut from Float32Array at rateIn (length round(n·rateOut/rateIn)). */
export function resampleSinc(input, rateIn, rateOut) {
  if (rateIn === rateOut) return input.slice();
  const scale = Math.min(1, rateOut / rateIn);
  const cutoff = scale * 0.97; // a little below the lower Nyquist: no aliasing
  const reach = Math.ceil(HALF_TAPS / scale); // input samples each side
  const taps = 2 * reach + 1;
  // Output j sits at input position j·rateIn/rateOut: its fraction repeats every rateOut/g outputs, so
  // the kernel of each phase is computed once.
  const g = gcd(rateIn, rateOut);
  const step = rateIn / g, phases = rateOut / g;
  const i0beta = besselI0(KAISER_BETA);
  const kernels = new Float32Array(phases * taps);
  for (let p = 0; p < phases; p++) {
    const frac = ((p * step) % phases) / phases; // centre - floor(centre)
    for (let t = 0; t < taps; t++) {
      const x = t - reach - frac;
      const r = x / (reach + 1);
      const window = besselI0(KAISER_BETA * Math.sqrt(Math.max(0, 1 - r * r))) / i0beta;
      const arg = Math.PI * cutoff * x;
      kernels[p * taps + t] = window * (Math.abs(x) < 1e-9 ? cutoff : Math.sin(arg) / (Math.PI * x));
    }
  }
  const n = Math.round((input.length * rateOut) / rateIn);
  const out = new Float32Array(n);
  for (let j = 0; j < n; j++) {
    const base = Math.floor((j * step) / phases) - reach;
    const k = (j % phases) * taps;
    let acc = 0;
    for (let t = Math.max(0, -base), end = Math.min(taps, input.length - base); t < end; t++) {
      acc += input[base + t] * kernels[k + t];
    }
    out[j] = acc;
  }
  return out;
}

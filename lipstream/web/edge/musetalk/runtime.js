// onnxruntime-web sessions for the three MuseTalk graphs: backend choice (WebGPU with shader-f16 ->
// fp16 graphs, WebGPU without -> fp32 graphs, no adapter -> wasm), sessions created one at a time from
// sha256-checked bytes, fixed shapes with a count of the distinct input shapes each session saw.

import { fetchChecked } from './files.js';

export const GRAPHS = ['whisper_encoder', 'unet', 'vae_decoder'];

/** { backend: 'webgpu'|'wasm', f16: bool, adapter: string } for this browser (or as forced by options). */
export async function chooseBackend(options = {}) {
  const gpu = globalThis.navigator?.gpu;
  let adapter = null;
  if (options.backend !== 'wasm' && gpu) {
    try { adapter = await gpu.requestAdapter(); } catch { adapter = null; }
  }
  if (!adapter) {
    if (options.backend === 'webgpu') throw new Error('WebGPU was asked for but this browser offers no adapter');
    const why = options.backend === 'wasm' ? 'not used (wasm asked for)' : 'none (WebGPU unavailable: running on the CPU through wasm)';
    return { backend: 'wasm', f16: false, adapter: why };
  }
  const info = adapter.info || {};
  return { backend: 'webgpu', f16: adapter.features.has('shader-f16'), adapter: `${info.vendor || '?'}/${info.architecture || '?'}` };
}

/** The graph variants the export holds: [{dtype, folder, manifest}] (one `lipstream export onnx` each). */
export function graphVariants(musetalk) {
  const onnx = musetalk.onnx;
  const list = Array.isArray(onnx) ? onnx : onnx.variants ? Object.values(onnx.variants) : [onnx];
  return list.map((v) => ({ dtype: v.manifest.dtype, folder: v.folder, manifest: v.manifest }));
}

/** Pick the graphs for a backend: fp16 only where WebGPU has shader-f16, or on wasm when asked (or only fp16 exists). */
export function pickVariant(variants, choice, wantDtype = null) {
  const by = Object.fromEntries(variants.map((v) => [v.dtype, v]));
  const order = wantDtype ? [wantDtype] : choice.backend === 'webgpu' && choice.f16 ? ['float16', 'float32'] : ['float32', 'float16'];
  for (const dtype of order) {
    if (!by[dtype]) continue;
    if (dtype === 'float16' && choice.backend === 'webgpu' && !choice.f16) continue; // no f16 shaders: cannot run
    return by[dtype];
  }
  return null;
}

function graphEntry(manifest, name) {
  const g = manifest.graphs?.[name];
  if (!g) throw new Error(`the ONNX manifest has no '${name}' graph; re-run lipstream export onnx`);
  return g;
}

/** A session with its fixed input shapes and a record of every shape it was run with. */
export class FixedSession {
  constructor(name, session, inputs, dtypes) {
    Object.assign(this, { name, session, inputs, dtypes });
    this.shapes = new Set();
    this.runs = 0;
  }

  async run(feeds) {
    for (const [k, t] of Object.entries(feeds)) this.shapes.add(`${k}:${t.dims.join('x')}`);
    this.runs++;
    return this.session.run(feeds);
  }

  get distinctShapes() { return this.shapes.size / Object.keys(this.inputs).length; }
}

/** Create the three sessions one after another (each fetch + compile finishes before the next starts). */
export async function createSessions(ort, baseUrl, files, variant, choice, onStatus = () => {}) {
  const sessions = {};
  for (const name of GRAPHS) {
    const g = graphEntry(variant.manifest, name);
    const expected = (rel) => files[`${variant.folder}/${rel}`] || variant.manifest.files?.[rel] || {};
    const path = `${variant.folder}/${g.file}`;
    onStatus(`loading ${path}`);
    const model = new Uint8Array(await fetchChecked(baseUrl, path, expected(g.file)));
    const externalData = [];
    for (const rel of g.external_data || []) { // named as the graph names them (its location field)
      externalData.push({ path: rel, data: new Uint8Array(await fetchChecked(baseUrl, `${variant.folder}/${rel}`, expected(rel))) });
    }
    // one graph may be put on another backend (options.graphBackends), e.g. the VAE decoder on wasm
    // where WebGPU is SwiftShader (minutes per batch there)
    const backendOf = (graph) => choice.graphBackends?.[graph] || choice.backend;
    const backend = backendOf(name);
    const opts = { executionProviders: [backend], graphOptimizationLevel: 'all', externalData, logSeverityLevel: 3 };
    // the UNet's output feeds the VAE decoder: on WebGPU it stays a GPU buffer between the two runs
    if (name === 'unet' && backend === 'webgpu' && backendOf('vae_decoder') === 'webgpu') opts.preferredOutputLocation = 'gpu-buffer';
    let session;
    try {
      session = await ort.InferenceSession.create(model, opts);
    } catch (err) {
      throw new Error(`${path} could not be loaded on ${backend} (${err.message || err})`);
    }
    const inputs = Object.fromEntries(g.inputs.map((i) => [i.name, i.shape]));
    const dtypes = Object.fromEntries(g.inputs.map((i) => [i.name, i.dtype]));
    sessions[name] = new FixedSession(name, session, inputs, dtypes);
  }
  return sessions;
}

/** A zero tensor of an input's fixed shape and dtype. */
export function zeros(ort, session, input) {
  const dims = session.inputs[input];
  const n = dims.reduce((a, b) => a * b, 1);
  return session.dtypes[input] === 'float16' ? new ort.Tensor('float16', new Uint16Array(n), dims) : new ort.Tensor('float32', new Float32Array(n), dims);
}

/** float32 values -> float16 bits (round to nearest even). */
export function toHalf(src, out = new Uint16Array(src.length)) {
  if (globalThis.Float16Array) { out.set(new Uint16Array(new Float16Array(src).buffer)); return out; }
  const f = new Float32Array(1), u = new Uint32Array(f.buffer);
  for (let i = 0; i < src.length; i++) {
    f[0] = src[i];
    const x = u[0], sign = (x >>> 16) & 0x8000, exp = (x >>> 23) & 0xff, mant = x & 0x7fffff;
    let h;
    if (exp === 0xff) h = sign | 0x7c00 | (mant ? 0x200 : 0);
    else if (exp > 142) h = sign | 0x7c00;
    else if (exp < 103) h = sign;
    else if (exp < 113) { const m = mant | 0x800000, s = 126 - exp; h = sign | ((m >> s) + (((m >> (s - 1)) & 1) && ((m & ((1 << (s - 1)) - 1)) || ((m >> s) & 1)) ? 1 : 0)); }
    else { h = sign | ((exp - 112) << 10) | (mant >> 13); const rest = mant & 0x1fff; if (rest > 0x1000 || (rest === 0x1000 && (h & 1))) h++; }
    out[i] = h;
  }
  return out;
}

/** float16 bits -> float32 values. */
export function fromHalf(bits, out = new Float32Array(bits.length)) {
  if (globalThis.Float16Array) { out.set(new Float16Array(bits.buffer, bits.byteOffset, bits.length)); return out; }
  for (let i = 0; i < bits.length; i++) {
    const h = bits[i], s = h & 0x8000 ? -1 : 1, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    out[i] = e === 0 ? s * m * 2 ** -24 : e === 31 ? (m ? NaN : s * Infinity) : s * (1 + m / 1024) * 2 ** (e - 15);
  }
  return out;
}

/** A tensor's values as float32 (fp16 outputs converted). */
export function tensorFloat(tensor) {
  const d = tensor.data;
  if (tensor.type === 'float16') return d instanceof Uint16Array ? fromHalf(d) : Float32Array.from(d);
  return d;
}

// The MuseTalk engine's Worker: JS log-mel -> Whisper graph -> windows -> silence/planner/codebook ->
// UNet + VAE graphs in fixed batches -> RGBA words with the mouth mask -> patches to the main thread.
// Messages in: init, begin, push, end, cancel, close. Out: status, ready, error, patch, done.

import { LogMelExtractor, SEGMENT_SAMPLES } from './mel.js';
import { frameWindows, encoderSteps, LOOKAHEAD_FRAMES, WINDOW_STEPS } from './windows.js';
import { frameRms, silentMask, speakingMask, SAMPLES_PER_FRAME } from './levels.js';
import { SimHashCodebook, codebookFromSeed } from './codebook.js';
import { openCodebookDb, loadCodebookInto, saveCodebook } from './codebook-store.js';
import { PatchScheduler } from './scheduler.js';
import { packPatch } from './pixels.js';
import { fetchChecked } from './files.js';
import { chooseBackend, createSessions, fromHalf, graphVariants, pickVariant, tensorFloat, toHalf, zeros } from './runtime.js';
import { StageTimer } from './stages.js';

const PATCH = 256;
const WORDS = PATCH * PATCH;

class MuseTalkWorker {
  async init({ manifest, baseUrl, options = {} }) {
    this.manifest = manifest;
    this.baseUrl = baseUrl;
    this.options = options;
    const files = manifest.files || {};
    const mt = manifest.musetalk;
    if (!mt) throw new Error('export.json has no "musetalk" section: export with --engine musetalk');
    const status = (text) => postMessage({ type: 'status', text });
    const ortPath = options.ortModule || 'musetalk/ort/ort.webgpu.min.mjs';
    const ort = await import(new URL(ortPath, baseUrl).href);
    ort.env.logLevel = 'error'; // ORT's optimiser warnings (constant folding) are not problems of the page
    ort.env.wasm.wasmPaths = new URL(ortPath.replace(/[^/]*$/, ''), baseUrl).href;
    ort.env.wasm.numThreads = options.numThreads || ort.env.wasm.numThreads;
    this.ort = ort;
    this.choice = await chooseBackend(options);
    const variants = graphVariants(mt);
    let variant = pickVariant(variants, this.choice, options.dtype);
    if (!variant && this.choice.backend === 'webgpu' && !this.choice.f16) {
      // only fp16 graphs and no f16 shaders on this adapter: wasm runs fp16 on the CPU
      this.choice = { backend: 'wasm', f16: false, adapter: `${this.choice.adapter} without shader-f16 (fp16 graphs on wasm)` };
      variant = pickVariant(variants, this.choice, options.dtype);
    }
    if (!variant) throw new Error(`the export has no ${options.dtype || 'usable'} MuseTalk graphs for ${this.choice.backend}`);
    this.variant = variant;
    if (options.graphBackends) this.choice.graphBackends = options.graphBackends;
    this.batch = variant.manifest.batch;
    status(`MuseTalk on ${this.choice.backend} (${variant.dtype}, adapter ${this.choice.adapter})`);
    this.sessions = await createSessions(ort, baseUrl, files, variant, this.choice, status);
    const latPath = mt.latents.file;
    this.latents = new Uint16Array(await fetchChecked(baseUrl, latPath, files[latPath]));
    this.latentSize = mt.latents.shape.slice(1).reduce((a, b) => a * b, 1);
    const masks = manifest.masks;
    this.maskPack = masks ? new Uint8Array(await fetchChecked(baseUrl, masks.file, files[masks.file])) : null;
    this.maskCache = new Map();
    this.loop = manifest.loop?.frames || [0];
    this.mel = new LogMelExtractor();
    this.dim = this.sessions.unet.inputs.audio[2];
    this.featureDim = this.sessions.unet.inputs.audio[1] * this.dim;
    this.codebookKey = `${manifest.name}/musetalk/${variant.dtype}`;
    this.codebook = await this._codebook(mt, files);
    this.timer = new StageTimer();
    // warmup false: the first real pass pays the graphs' first-run cost instead (a page that renders at once)
    if (options.warmup !== false) await this._warmup(status);
    return {
      backend: this.choice.backend, dtype: variant.dtype, adapter: this.choice.adapter, batch: this.batch,
      codebookEntries: this.codebook ? this.codebook.size : 0, codebookSource: this.codebookSource,
    };
  }

  async _codebook(mt, files) {
    if (this.options.codebook === false || !mt.codebook) { this.codebookSource = 'off'; return null; }
    const meta = mt.codebook;
    const seed = await fetchChecked(this.baseUrl, meta.file, files[meta.file]);
    const book = codebookFromSeed(meta, seed);
    this.db = this.options.persist === false ? null : await openCodebookDb().catch(() => null);
    this.codebookSource = meta.entries ? 'export seed' : 'new';
    if (this.db && (await loadCodebookInto(this.db, this.codebookKey, book))) this.codebookSource = 'IndexedDB';
    return book;
  }

  async _warmup(status) {
    const { ort, sessions } = this;
    for (const name of ['whisper_encoder', 'unet', 'vae_decoder']) {
      status(`warming up ${name}`);
      const s = sessions[name];
      const feeds = Object.fromEntries(Object.keys(s.inputs).map((k) => [k, zeros(ort, s, k)]));
      const out = await s.run(feeds);
      for (const t of Object.values(out)) t.dispose?.();
    }
  }

  async _alpha(sourceFrame) {
    if (!this.maskPack) return null;
    if (this.maskCache.has(sourceFrame)) return this.maskCache.get(sourceFrame);
    const off = this.manifest.masks.offsets;
    const blob = new Blob([this.maskPack.subarray(off[sourceFrame], off[sourceFrame + 1])], { type: 'image/png' });
    const bitmap = await createImageBitmap(blob);
    const canvas = new OffscreenCanvas(PATCH, PATCH);
    const ctx = canvas.getContext('2d', { willReadFrequently: true });
    ctx.drawImage(bitmap, 0, 0, PATCH, PATCH);
    const rgba = ctx.getImageData(0, 0, PATCH, PATCH).data;
    const alpha = new Uint8Array(WORDS);
    for (let p = 0; p < WORDS; p++) alpha[p] = rgba[4 * p];
    if (this.maskCache.size > 64) this.maskCache.delete(this.maskCache.keys().next().value);
    this.maskCache.set(sourceFrame, alpha);
    return alpha;
  }

  /** Stacked Whisper states [steps*S*D] of pcm (<= 30 s): JS log-mel then the encoder graph. */
  async _encode(pcm) {
    const t0 = performance.now();
    const mel = this.mel.extract(pcm);
    const t1 = performance.now();
    const s = this.sessions.whisper_encoder;
    const out = await s.run({ mel: new this.ort.Tensor('float32', mel, s.inputs.mel) });
    const states = tensorFloat(Object.values(out)[0]);
    this.timer.add('mel', t1 - t0);
    this.timer.add('whisper', performance.now() - t1);
    return states;
  }

  /** Render keyframes in fixed batches (tail padded with the last item): RGBA words with that frame's mask. */
  async _render(items) {
    const { ort, sessions, batch } = this;
    const unet = sessions.unet, vae = sessions.vae_decoder;
    const out = [];
    for (let start = 0; start < items.length; start += batch) {
      const chunk = items.slice(start, start + batch);
      while (chunk.length < batch) chunk.push(chunk[chunk.length - 1]); // fixed shape: duplicate the last slice
      const lat = new Float32Array(batch * this.latentSize);
      const aud = new Float32Array(batch * this.featureDim);
      chunk.forEach((it, b) => {
        lat.set(fromHalf(this.latents.subarray(it.sourceFrame * this.latentSize, (it.sourceFrame + 1) * this.latentSize)), b * this.latentSize);
        aud.set(it.features, b * this.featureDim);
      });
      const tensor = (name, data) => unet.dtypes[name] === 'float16'
        ? new ort.Tensor('float16', toHalf(data), unet.inputs[name]) : new ort.Tensor('float32', data, unet.inputs[name]);
      const t0 = performance.now();
      const pred = Object.values(await unet.run({ latents: tensor('latents', lat), audio: tensor('audio', aud) }))[0];
      const t1 = performance.now();
      const rgbT = Object.values(await vae.run({ latents: pred }))[0];
      const rgb = tensorFloat(rgbT);
      pred.dispose?.();
      const t2 = performance.now();
      this.timer.add('unet_batch', t1 - t0);
      this.timer.add('vae_batch', t2 - t1);
      for (let b = 0; b < Math.min(batch, items.length - start); b++) {
        const alpha = await this._alpha(items[start + b].sourceFrame);
        const t3 = performance.now();
        out.push(packPatch(rgb, b, PATCH, alpha, new Uint32Array(WORDS)));
        this.timer.add('pack', performance.now() - t3);
      }
      rgbT.dispose?.();
    }
    return out;
  }

  begin({ loopFrameAt0 = 0, utterance = 0 }) {
    this.utt = { id: utterance, loopFrameAt0, pcm: new Float32Array(0), emitted: 0, pushedFrames: 0, cancelled: false };
    this.scheduler = new PatchScheduler({
      dim: this.featureDim, codebook: this.codebook, timer: this.timer,
      render: (items) => this._render(items), alphaFor: (f) => this._alpha(f),
    });
  }

  push({ pcm }) {
    const u = this.utt;
    const joined = new Float32Array(u.pcm.length + pcm.length);
    joined.set(u.pcm); joined.set(pcm, u.pcm.length);
    u.pcm = joined;
  }

  /** Features of frames [first, upto) from the audio so far (re-encodes only the segments they need). */
  async _features(first, upto) {
    const u = this.utt;
    const total = encoderSteps(u.pcm.length);
    const stepSize = this.featureDim / WINDOW_STEPS;
    const firstStep = Math.max(0, 2 * first - 4), lastStep = Math.min(total, 2 * (upto - 1) + 6);
    const segSteps = SEGMENT_SAMPLES / 320;
    const parts = [];
    const seg0 = Math.floor(firstStep / segSteps);
    for (let seg = seg0; seg * segSteps < lastStep; seg++) {
      const states = await this._encode(u.pcm.subarray(seg * SEGMENT_SAMPLES, (seg + 1) * SEGMENT_SAMPLES));
      parts.push(states.subarray(0, Math.min(segSteps, total - seg * segSteps) * stepSize));
    }
    const held = new Float32Array(parts.reduce((a, p) => a + p.length, 0));
    let off = 0;
    for (const p of parts) { held.set(p, off); off += p.length; }
    return frameWindows(held, stepSize, first, upto - first, total, seg0 * segSteps);
  }

  async process(final) {
    const u = this.utt;
    const frames = Math.floor(u.pcm.length / SAMPLES_PER_FRAME);
    const upto = final ? frames : Math.max(0, frames - LOOKAHEAD_FRAMES - 3); // 3: the silent-run rule settles
    const t0 = performance.now();
    let decided = [];
    if (upto > u.pushedFrames) {
      const feats = await this._features(u.pushedFrames, upto);
      // skipped (left to the base video): silent frames outside the speaking margin, as in render/accel.py
      const skip = speakingMask(silentMask(frameRms(u.pcm))).subarray(u.pushedFrames, upto).map((v) => 1 - v);
      this.timer.add('features', performance.now() - t0);
      const ids = Array.from({ length: upto - u.pushedFrames }, (_, i) => this.loop[(u.loopFrameAt0 + u.pushedFrames + i) % this.loop.length]);
      u.pushedFrames = upto;
      decided = await this.scheduler.push(feats, skip, ids);
    }
    if (final) decided = decided.concat(await this.scheduler.finish());
    if (u.cancelled) return;
    for (const d of decided) {
      const last = final && d === decided[decided.length - 1];
      const msg = { type: 'patch', utterance: u.id, frame: d.index, sourceFrame: d.sourceFrame, kind: d.kind, last,
        rgba: d.patch ? d.patch.buffer : null, timing: last ? this.timer.snapshot() : undefined };
      postMessage(msg, d.patch ? [d.patch.buffer] : []);
    }
    if (final) {
      if (this.db && this.codebook) await saveCodebook(this.db, this.codebookKey, this.codebook).catch(() => {});
      postMessage({ type: 'done', utterance: u.id, stats: this.stats() });
    }
  }

  stats() {
    const shapes = Object.fromEntries(Object.entries(this.sessions).map(([k, s]) => [k, s.distinctShapes]));
    return { scheduler: this.scheduler?.stats, timing: this.timer.snapshot(), distinctShapes: shapes,
      codebookEntries: this.codebook?.size || 0, codebookSource: this.codebookSource, backend: this.choice.backend, dtype: this.variant.dtype };
  }
}

const engine = new MuseTalkWorker();
let queue = Promise.resolve();
// messages run one at a time, in order; an error is reported and the next message still runs
onmessage = (event) => {
  const msg = event.data;
  if (msg.type === 'cancel' && engine.utt) engine.utt.cancelled = true;
  queue = queue.then(async () => {
    try {
      if (msg.type === 'init') postMessage({ type: 'ready', info: await engine.init(msg) });
      else if (msg.type === 'begin') engine.begin(msg);
      else if (msg.type === 'push') { engine.push(msg); if (!msg.hold) await engine.process(false); }
      else if (msg.type === 'end') await engine.process(true);
      else if (msg.type === 'stats') postMessage({ type: 'stats', stats: engine.stats() });
      else if (msg.type === 'close') close();
    } catch (err) {
      postMessage({ type: 'error', during: msg.type, message: err.message || String(err) });
    }
  });
};

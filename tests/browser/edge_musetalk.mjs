// Drives the in-browser MuseTalk engine (lipstream/web/edge/musetalk) in headless Debian Chromium and
// prints one JSON result line. Usage: node edge_musetalk.mjs '{"url": "http://127.0.0.1:PORT", "scenario": "..."}'
// The served folder holds musetalk/ (the engine, as the export copies it), harness.html and fixtures.
import { launchChromium, printFailure, printResult } from './chromium.mjs';

const opts = JSON.parse(process.argv[2] || '{}');
const webgpu = opts.webgpu !== false;
const browser = await launchChromium(webgpu ? ['--enable-unsafe-webgpu'] : [], { autoplay: false });
const problems = [];

async function openPage(context) {
  const page = await context.newPage();
  page.on('pageerror', (err) => problems.push(`pageerror: ${err.message}`));
  page.on('console', (msg) => {
    if (msg.type() === 'error') problems.push(`console: ${msg.text()}`);
    else if (opts.verbose) console.error(`[page ${(performance.now() / 1000).toFixed(1)} s] ${msg.text()}`);
  });
  await page.goto(`${opts.url}/harness.html`);
  return page;
}

// in the page: helpers shared by the scenarios
const PAGE_HELPERS = `
  window.b64 = (typed) => { const u8 = new Uint8Array(typed.buffer, typed.byteOffset, typed.byteLength); let s = '';
    for (let i = 0; i < u8.length; i += 0x8000) s += String.fromCharCode.apply(null, u8.subarray(i, i + 0x8000)); return btoa(s); };
  window.fetchF32 = async (p) => new Float32Array(await (await fetch(p)).arrayBuffer());
  window.runEngine = async (engineOpts, pcm, loopFrameAt0 = 0) => {
    const { createEngine } = await import('/musetalk/engine.js');
    const manifest = await (await fetch('/export.json')).json();
    const patches = [];
    let doneStats = null;
    const t0 = performance.now();
    const engine = createEngine(manifest, '/', { engine: engineOpts, onStatus: (text) => console.log('status: ' + text),
      onPatch: (p) => patches.push({ frame: p.frame, kind: p.kind, sourceFrame: p.sourceFrame, last: p.last,
        rgba: p.rgba && !engineOpts.noPixels ? window.b64(p.rgba) : null }), // noPixels: the bench needs counts only
      onDone: (s) => { doneStats = s; } });
    try { await engine.ready; } catch (err) { engine.close(); return { error: err.message, readyMs: performance.now() - t0 }; }
    const readyMs = performance.now() - t0;
    engine.begin({ loopFrameAt0 });
    const t1 = performance.now();
    engine.push(pcm, { hold: true });
    engine.end();
    while (!doneStats) await new Promise((r) => setTimeout(r, 20));
    const runMs = performance.now() - t1;
    const info = engine.info;
    engine.close();
    return { info, readyMs, runMs, stats: doneStats, patches };
  };
`;

let result;
try {
  const context = await browser.newContext();
  const page = await openPage(context);
  await page.addScriptTag({ content: PAGE_HELPERS });
  if (opts.scenario === 'mel') {
    result = await page.evaluate(async () => {
      const { LogMelExtractor } = await import('/musetalk/mel.js');
      const pcm = await window.fetchF32('/fixtures/pcm.f32');
      const ex = new LogMelExtractor();
      const t0 = performance.now();
      const mel = ex.extract(pcm);
      return { ms: performance.now() - t0, mel: window.b64(mel) };
    });
  } else if (opts.scenario === 'decisions') {
    result = await page.evaluate(async (dim) => {
      const { frameRms, silentMask, speakingMask } = await import('/musetalk/levels.js');
      const { KeyframePlanner } = await import('/musetalk/planner.js');
      const { SimHashCodebook } = await import('/musetalk/codebook.js');
      const { crossfade, packPatch } = await import('/musetalk/pixels.js');
      const pcm = await window.fetchF32('/fixtures/pcm.f32');
      const feats = await window.fetchF32('/fixtures/features.f32');
      const planes = await window.fetchF32('/fixtures/hyperplanes.f32');
      const silent = silentMask(frameRms(pcm));
      const skip = speakingMask(silent).map((v) => 1 - v);
      const planner = new KeyframePlanner();
      const n = skip.length, half = Math.floor(n / 2);
      // two chunks, as a stream: the second half is planned after the first
      const plan = [...planner.plan(feats.subarray(0, half * dim), dim, skip.subarray(0, half)),
        ...planner.plan(feats.subarray(half * dim, n * dim), dim, skip.subarray(half)), ...planner.finish()];
      const book = new SimHashCodebook({ dim, hyperplanes: planes, maxEntries: 8, threshold: 12, patchWords: 4 });
      const codes = book.hash(feats.subarray(0, n * dim));
      const hits = [];
      for (let i = 0; i < n; i++) {
        const found = book.lookup(codes[2 * i], codes[2 * i + 1]);
        hits.push([found.entry, found.distance]);
        if (!found.patch) book.insert(codes[2 * i], codes[2 * i + 1], new Uint32Array(4).fill(i));
      }
      // infill and packing on random patches, and their speed
      const a = new Uint32Array(65536), b = new Uint32Array(65536), out = new Uint32Array(65536), alpha = new Uint8Array(65536);
      const rnd = await window.fetchF32('/fixtures/rgb.f32'); // [2, 3, 256, 256] floats 0..255
      packPatch(rnd, 0, 256, alpha.fill(255), a); packPatch(rnd, 1, 256, alpha, b);
      const fades = [];
      for (const t of [0, 0.25, 1 / 3, 0.5, 0.75, 1]) fades.push(window.b64(crossfade(a, b, t, null, new Uint32Array(65536))));
      const reps = 200;
      let t0 = performance.now();
      for (let r = 0; r < reps; r++) crossfade(a, b, r / reps, alpha, out);
      const infillMs = (performance.now() - t0) / reps;
      t0 = performance.now();
      for (let r = 0; r < reps; r++) packPatch(rnd, r & 1, 256, alpha, out);
      const packMs = (performance.now() - t0) / reps;
      return { silent: Array.from(silent), skip: Array.from(skip), plan, codes: Array.from(codes), hits,
        threshold: planner.config.velocityThreshold, packed: [window.b64(a), window.b64(b)], fades, infillMs, packMs };
    }, opts.dim);
  } else if (opts.scenario === 'engine') {
    const pcmPath = opts.pcm || '/fixtures/pcm.f32';
    result = await page.evaluate(async ([engineOpts, pcmPath]) => window.runEngine(engineOpts, await window.fetchF32(pcmPath)), [opts.engine || {}, pcmPath]);
  } else if (opts.scenario === 'reload') {
    // the codebook persists in IndexedDB: the same speech after a reload needs no engine pass
    const pcmPath = opts.pcm || '/fixtures/pcm.f32';
    const run = async ([e, path]) => window.runEngine(e, await window.fetchF32(path));
    const first = await page.evaluate(run, [opts.engine || {}, pcmPath]);
    await page.reload();
    await page.addScriptTag({ content: PAGE_HELPERS });
    const second = await page.evaluate(run, [opts.engine || {}, pcmPath]);
    for (const r of [first, second]) delete r.patches;
    result = { first, second };
  } else {
    throw new Error(`unknown scenario ${opts.scenario}`);
  }
  printResult(result, problems);
} catch (err) {
  printFailure(err, problems);
} finally {
  await browser.close();
}

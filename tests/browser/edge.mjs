// Drives the serverless page (a `lipstream export web` folder behind any static server) in headless
// Debian Chromium and prints one JSON result line.
// Usage: node edge.mjs '{"url": "http://127.0.0.1:PORT/", "scenario": "play", "wav": "/path/speech.wav", ...}'
// Scenarios: play (file -> playback, stats), parity (raw engine patches written to outDir), stall (base video
// paused on one frame while speech plays), blink (blinks at phrase ends: the lids on the overlay, video held on one
// frame), bad_audio (undecodable file), broken (a missing/corrupted file).
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { launchChromium, printFailure, printResult } from './chromium.mjs';

const opts = JSON.parse(process.argv[2] || '{}');
const timeoutMs = opts.timeoutMs || 120000;

// --cdp: a browser the user started (e.g. their own Chrome with --remote-debugging-port=9222).
const browser = opts.cdp
  ? await chromium.connectOverCDP(opts.cdp)
  : await launchChromium(opts.webgpu ? ['--enable-unsafe-webgpu'] : []);
const problems = [];

async function openPage({ waitReady = true } = {}) {
  const context = opts.cdp ? browser.contexts()[0] || await browser.newContext() : browser;
  const page = await context.newPage({ viewport: opts.viewport || { width: 1000, height: 1000 } });
  page.on('pageerror', (err) => problems.push(`pageerror: ${err.message}`));
  page.on('console', (msg) => { if (msg.type() === 'error') problems.push(`console: ${msg.text()}`); });
  await page.goto(opts.url);
  if (waitReady) {
    await page.waitForFunction(() => /^ready/.test(document.querySelector('#status').textContent)
      || document.querySelector('#error').textContent, null, { timeout: timeoutMs });
    const error = await page.textContent('#error');
    if (error) throw new Error(`page did not get ready: ${error}`);
  }
  return page;
}

async function playFile(page, wav) {
  await page.setInputFiles('#file', wav);
  await page.waitForFunction(() => !document.querySelector('#play').disabled || document.querySelector('#error').textContent,
    null, { timeout: timeoutMs });
  const error = await page.textContent('#error');
  if (error) return { error };
  const before = await page.evaluate(() => window.lipstreamEdge.stats.events.length);
  await page.click('#play');
  await page.waitForFunction((n) => window.lipstreamEdge.stats.events.slice(n).some((e) => e.type === 'playback_finished'),
    before, { timeout: timeoutMs, polling: 100 });
  return { error: null };
}

const summary = (page) => page.evaluate(() => {
  const s = window.lipstreamEdge.stats;
  const sorted = (a) => [...a].sort((x, y) => x - y);
  const pct = (a, q) => (a.length ? sorted(a)[Math.min(a.length - 1, Math.floor(q * a.length))] : null);
  return {
    framesShown: s.framesShown, speechFramesShown: s.speechFramesShown, late: s.late, skipped: s.skipped,
    patches: s.patches, events: s.events, blinks: s.blinks, blinkStarts: s.blinkStarts,
    mainMsP50: pct(s.mainMs, 0.5), mainMsP95: pct(s.mainMs, 0.95), mainMsMax: pct(s.mainMs, 1.0), ticks: s.mainMs.length,
    renderMsP50: pct(s.renderMs, 0.5), renderMsP95: pct(s.renderMs, 0.95),
    featureMsP50: pct(s.featureMs, 0.5),
    stages: Object.fromEntries(Object.entries(s.stages).map(([k, a]) => [k, { p50: pct(a, 0.5), p95: pct(a, 0.95), n: a.length }])),
    playToFirstFrameMs: s.firstFrameAt !== null ? s.firstFrameAt - s.playAt : null,
    playToFirstMouthMs: s.firstMouthAt !== null ? s.firstMouthAt - s.playAt : null,
    log: s.log,
    errors: window.lipstreamEdge.errors,
  };
});

/** Pause the base video on loop index `loopIndex` (a stalled decoder; or known loop positions for a test). */
const holdVideo = (page, loopIndex) => page.evaluate(async (index) => {
  const v = document.querySelector('#base');
  v.pause();
  await new Promise((resolve) => { v.addEventListener('seeked', resolve, { once: true }); v.currentTime = (index + 0.5) / 25; });
}, loopIndex);

/** Bounding box of the overlay's non-transparent pixels, in video pixels. */
const overlayBox = (page) => page.evaluate(() => {
  const c = document.querySelector('#mouth');
  const data = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let x1 = Infinity, y1 = Infinity, x2 = -1, y2 = -1;
  for (let y = 0; y < c.height; y++) {
    for (let x = 0; x < c.width; x++) {
      if (data[(y * c.width + x) * 4 + 3] > 0) {
        if (x < x1) x1 = x; if (x > x2) x2 = x; if (y < y1) y1 = y; if (y > y2) y2 = y;
      }
    }
  }
  return x2 < 0 ? null : [x1, y1, x2 + 1, y2 + 1];
});

let result;
try {
  const scenario = opts.scenario || 'play';
  if (scenario === 'play') {
    const page = await openPage();
    const played = await playFile(page, opts.wav);
    result = { ...played, ...(await summary(page)), status: await page.textContent('#status'), gpu: await page.textContent('#gpu') };
    if (opts.screenshot) await page.screenshot({ path: opts.screenshot });
  } else if (scenario === 'parity') {
    // The engine through its public interface, on the page's own modules: every patch, loop frame 0 at frame 0.
    const page = await openPage();
    const bytes = [...(await import('node:fs')).readFileSync(opts.wav)];
    const out = await page.evaluate(async (wavBytes) => {
      const { createEngine } = await import('./viseme/engine.js');
      const app = window.lipstreamEdge;
      const buffer = await new OfflineAudioContext(1, 1, 16000).decodeAudioData(new Uint8Array(wavBytes).buffer);
      const pcm = buffer.getChannelData(0);
      const patches = [];
      let done;
      const finished = new Promise((resolve) => { done = resolve; });
      const engine = createEngine(app.manifest, new URL('./', location.href), {
        onPatch: (p) => { patches.push(p); if (p.last) done(); },
      });
      await engine.ready;
      engine.begin({ loopFrameAt0: 0 });
      for (let i = 0; i < pcm.length; i += 4000) engine.push(pcm.subarray(i, Math.min(i + 4000, pcm.length)));
      engine.end();
      await finished;
      engine.close();
      const size = app.manifest.crop_size;
      const frames = patches.filter((p) => p.rgba);
      const all = new Uint8Array(frames.length * size * size * 4);
      frames.forEach((p, i) => all.set(p.rgba, i * size * size * 4));
      let b64 = '';
      for (let i = 0; i < all.length; i += 0x8000) b64 += String.fromCharCode(...all.subarray(i, i + 0x8000));
      return {
        frames: patches.map((p) => ({ frame: p.frame, sourceFrame: p.sourceFrame, moved: !!p.rgba, feature: p.feature, release: !!p.release })),
        rgba: btoa(b64), samples: pcm.length,
      };
    }, bytes);
    writeFileSync(join(opts.outDir, 'patches.rgba'), Buffer.from(out.rgba, 'base64'));
    result = { frames: out.frames, samples: out.samples };
  } else if (scenario === 'stall') {
    const page = await openPage();
    // Stall the base video on one frame (as a decoder stall or a paused tab would), then speak.
    await holdVideo(page, opts.stallLoopIndex);
    await page.setInputFiles('#file', opts.wav);
    await page.waitForFunction(() => !document.querySelector('#play').disabled, null, { timeout: timeoutMs });
    await page.click('#play');
    const boxes = [];
    for (let i = 0; i < 6; i++) {
      await page.waitForFunction((n) => window.lipstreamEdge.stats.speechFramesShown > n, 8 + i * 6, { timeout: timeoutMs, polling: 20 });
      const shot = await page.evaluate(() => {
        const log = window.lipstreamEdge.stats.log;
        return log[log.length - 1];
      });
      boxes.push({ overlay: await overlayBox(page), entry: shot });
    }
    await page.waitForFunction(() => window.lipstreamEdge.stats.events.some((e) => e.type === 'playback_finished'), null, { timeout: timeoutMs });
    result = { boxes, ...(await summary(page)) };
  } else if (scenario === 'blink') {
    // Blinks at phrase ends: the base video held on loop index `stallLoopIndex` (so the page's loop positions, and
    // with them which phrase ends may blink, are known), speech played; at every display frame with lids up, the
    // overlay's eye rectangle is read back and compared with the video's own pixels there.
    const page = await openPage();
    await holdVideo(page, opts.stallLoopIndex);
    await page.evaluate(() => {
      const v = document.querySelector('#base');
      const app = window.lipstreamEdge;
      const overlay = document.querySelector('#mouth').getContext('2d');
      const copy = new OffscreenCanvas(1, 1).getContext('2d', { willReadFrequently: true });
      app.lidSamples = [];
      app.lidRectsSeen = [];
      const sample = () => {
        const d = app.compositor.lidDrawn;
        if (d && app.lidSamples.length < 40) {
          const [x0, y0, x1, y1] = d.rect;
          const w = x1 - x0, h = y1 - y0;
          const mine = overlay.getImageData(x0, y0, w, h).data;
          copy.canvas.width = w; copy.canvas.height = h;
          copy.drawImage(v, x0, y0, w, h, 0, 0, w, h);
          const video = copy.getImageData(0, 0, w, h).data;
          let opaque = 0, differs = 0;
          for (let i = 0; i < mine.length; i += 4) {
            if (mine[i + 3] === 255) opaque += 1;
            if (Math.abs(mine[i] - video[i]) + Math.abs(mine[i + 1] - video[i + 1]) + Math.abs(mine[i + 2] - video[i + 2]) > 6) differs += 1;
          }
          const log = app.stats.log;
          app.lidSamples.push({ k: log[log.length - 1].k, closure: d.closure, opaque, differs, pixels: w * h });
          if (!app.lidRectsSeen.some((r) => r.join() === d.rect.join())) app.lidRectsSeen.push(d.rect);
        }
        requestAnimationFrame(sample);
      };
      requestAnimationFrame(sample);
    });
    const played = await playFile(page, opts.wav);
    // after the utterance the overlay's eye rectangles hold nothing
    const leftover = await page.evaluate(() => {
      const overlay = document.querySelector('#mouth').getContext('2d');
      let alpha = 0;
      for (const [x0, y0, x1, y1] of window.lipstreamEdge.lidRectsSeen) {
        const data = overlay.getImageData(x0, y0, x1 - x0, y1 - y0).data;
        for (let i = 3; i < data.length; i += 4) alpha += data[i];
      }
      return alpha;
    });
    const extra = await page.evaluate(() => ({
      blinks: window.lipstreamEdge.stats.blinks, blinkStarts: window.lipstreamEdge.stats.blinkStarts,
      samples: window.lipstreamEdge.lidSamples, rects: window.lipstreamEdge.lidRectsSeen,
    }));
    result = { ...played, ...(await summary(page)), ...extra, leftover };
  } else if (scenario === 'pack') {
    // Float -> RGBA packing (mask in alpha, one Uint32 write per pixel) of a 256² frame, on the main thread.
    const page = await openPage({ waitReady: false });
    result = await page.evaluate(async (reps) => {
      const { packPlanarSigned } = await import('./packing.js');
      const n = 256 * 256;
      const planes = new Float32Array(3 * n).map(() => Math.random() * 2.2 - 1.1);
      const mask = new Uint8Array(n).map(() => Math.random() * 256);
      const out = new Uint32Array(n);
      for (let i = 0; i < 20; i++) packPlanarSigned(planes, mask, out); // warm the JIT
      const times = [];
      for (let i = 0; i < reps; i++) { const t = performance.now(); packPlanarSigned(planes, mask, out); times.push(performance.now() - t); }
      times.sort((a, b) => a - b);
      const px = out[12345];
      const ok = (px >>> 24) === mask[12345];
      return { packMsP50: times[Math.floor(reps / 2)], packMsP95: times[Math.floor(reps * 0.95)], alphaOk: ok };
    }, opts.reps || 200);
  } else if (scenario === 'bad_audio') {
    const page = await openPage();
    await page.setInputFiles('#file', opts.wav);
    await page.waitForFunction(() => document.querySelector('#error').textContent, null, { timeout: 30000 });
    result = { error: await page.textContent('#error'), playDisabled: await page.isDisabled('#play') };
  } else if (scenario === 'broken') {
    const page = await openPage({ waitReady: false });
    const t0 = Date.now();
    await page.waitForFunction(() => document.querySelector('#error').textContent, null, { timeout: 60000 });
    result = { error: await page.textContent('#error'), status: await page.textContent('#status'), waitedMs: Date.now() - t0 };
  } else {
    throw new Error(`unknown scenario ${scenario}`);
  }
  printResult(result, problems);
} catch (err) {
  printFailure(err, problems);
} finally {
  if (!opts.cdp) await browser.close();
}

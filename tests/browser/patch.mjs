// Drives the live player page in PATCH stream mode (protocol 1.2) in headless Debian Chromium against a real
// server and prints one JSON result line.
// Usage: node patch.mjs '{"url": "http://127.0.0.1:PORT", "avatar": "small", "scenario": "speak", "wav": "/x.wav"}'
// Scenarios: speak (upload a WAV; captures of composited frames), stall (the base video held on one frame while
// speech plays), interrupt, bad_mode (hello asks a stream mode the server lacks), base_fails (the base loop 404s),
// bench (speak a text; stats only, for benchmarks/scenarios/browser.py).
import { launchChromium, printFailure, printResult } from './chromium.mjs';

const opts = JSON.parse(process.argv[2] || '{}');
const scenario = opts.scenario || 'speak';
const timeoutMs = opts.timeoutMs || 90000;

const browser = await launchChromium();
const problems = [];

async function openPage({ stream = 'patch', context = browser, waitBase = true } = {}) {
  const page = await context.newPage({ viewport: { width: 1000, height: 1000 } });
  page.on('pageerror', (err) => problems.push(`pageerror: ${err.message}`));
  page.on('console', (msg) => { if (msg.type() === 'error') problems.push(`console: ${msg.text()}`); });
  await page.goto(`${opts.url}/?${new URLSearchParams({ avatar: opts.avatar, stream, ...(opts.token ? { token: opts.token } : {}) })}`);
  await page.waitForFunction((name) => [...document.querySelector('#avatar').options].some((o) => o.value === name), opts.avatar);
  await page.selectOption('#avatar', opts.avatar);
  const t0 = Date.now();
  await page.click('#start');
  await page.waitForFunction(() => !document.querySelector('#speak').disabled || /error/.test(document.querySelector('#status').textContent), null, { timeout: timeoutMs });
  if (waitBase) {
    await page.waitForFunction(() => window.lipstreamPlayer.stats.framesShown > 10, null, { timeout: timeoutMs });
  }
  return { page, openMs: Date.now() - t0 };
}

const snapshot = (page) => page.evaluate(() => window.lipstreamPlayer.snapshot());

/** Freeze playback on the newest decoded mouth patch, put the base video on that frame's loop index, redraw, and
 * read back the face box region of video + overlay (the composited picture) and of the overlay alone. */
async function capture(page) {
  return page.evaluate(async () => {
    const view = window.lipstreamPlayer.patchView;
    const c = view.compositor;
    const u = c.utterance;
    const patches = [...u.patches.values()].filter((p) => p.rgba);
    if (!patches.length) return null;
    const patch = patches[patches.length - 1];
    view.frozen = true;
    view.holdVideo = true;
    const v = view.video;
    const n = view.manifest.loop.frames.length;
    const loopIndex = patch.frame % n;
    v.pause();
    await new Promise((resolve) => { v.addEventListener('seeked', resolve, { once: true }); v.currentTime = (loopIndex + 0.5) / view.manifest.fps; });
    await new Promise((resolve) => v.requestVideoFrameCallback ? setTimeout(resolve, 50) : resolve());
    view._k = patch.frame;
    u.patches.set(patch.frame, patch);
    c.clear(); // what the live ticks drew (another frame's box) goes; then the frozen frame is drawn
    c.current = null;
    u.lastShown = -1;
    c.tick();
    const source = view.manifest.loop.frames[loopIndex];
    const [x1, y1, x2, y2] = view.manifest.boxes[source];
    const w = x2 - x1;
    const h = y2 - y1;
    const out = new OffscreenCanvas(w, h);
    const ctx = out.getContext('2d');
    ctx.drawImage(v, x1, y1, w, h, 0, 0, w, h);
    ctx.drawImage(view.canvas, x1, y1, w, h, 0, 0, w, h);
    const composite = ctx.getImageData(0, 0, w, h).data;
    const overlay = view.canvas.getContext('2d').getImageData(x1, y1, w, h).data;
    const b64 = (a) => { let s = ''; for (let i = 0; i < a.length; i += 8192) s += String.fromCharCode(...a.subarray(i, i + 8192)); return btoa(s); };
    const result = { frame: patch.frame, loopIndex, source, sourceFrame: patch.sourceFrame, box: [x1, y1, x2, y2],
      composite: b64(composite), overlay: b64(overlay), displayed: c.displayedLoopIndex() };
    view.frozen = false;
    view.holdVideo = false;
    v.play().catch(() => {});
    return result;
  });
}

async function waitFinished(page, before) {
  await page.waitForFunction(
    (n) => window.lipstreamPlayer.stats.events.slice(n).some((e) => e.type === 'playback_finished'),
    before, { timeout: timeoutMs, polling: 50 });
}

let result;
try {
  if (scenario === 'speak' || scenario === 'bench') {
    const { page, openMs } = await openPage();
    const liveStatus = await page.textContent('#status');
    const before = await page.evaluate(() => window.lipstreamPlayer.stats.events.length);
    if (opts.wav) await page.setInputFiles('#file', opts.wav);
    else { await page.fill('#text', opts.text || 'Hello from the patch stream.'); await page.click('#speak'); }
    const captures = [];
    if (scenario === 'speak') {
      await page.waitForFunction(() => window.lipstreamPlayer.stats.speechFramesShown > 6, null, { timeout: timeoutMs, polling: 20 });
      for (let i = 0; i < (opts.captures || 3); i++) {
        const shot = await capture(page);
        if (shot) captures.push(shot);
        await page.waitForTimeout(250);
      }
    }
    await waitFinished(page, before);
    await page.waitForTimeout(300);
    await page.evaluate(() => window.lipstreamPlayer._reportStats());
    result = { snap: await snapshot(page), captures, openMs, status: liveStatus };
  } else if (scenario === 'auto') {
    // the page's default (stream=auto) against this server: which mode the session got, and frames play
    const { page } = await openPage({ stream: 'auto' });
    result = { stream: await page.evaluate(() => window.lipstreamPlayer.ready.stream), snap: await snapshot(page) };
  } else if (scenario === 'coldwarm') {
    // time to the first frame of a new session: cold HTTP cache (a fresh profile), then warm (same profile)
    const context = await browser.newContext();
    const runs = [];
    for (const label of ['cold', 'warm']) {
      const { page, openMs } = await openPage({ context, stream: opts.stream || 'patch' });
      const snap = await snapshot(page);
      runs.push({ label, openMs, firstFrameMs: snap.firstFrameMs, baseLoadMs: snap.patch?.baseLoadMs ?? null, baseBytes: snap.patch?.baseBytes ?? null });
      await page.close();
    }
    result = { runs };
  } else if (scenario === 'stall') {
    const { page } = await openPage();
    // Hold the base video on one loop index (a stalled decoder or a busy tab), then speak.
    await page.evaluate(async (loopIndex) => {
      const view = window.lipstreamPlayer.patchView;
      view.holdVideo = true;
      const v = view.video;
      v.pause();
      await new Promise((resolve) => { v.addEventListener('seeked', resolve, { once: true }); v.currentTime = (loopIndex + 0.5) / 25; });
    }, opts.stallLoopIndex);
    const before = await page.evaluate(() => window.lipstreamPlayer.stats.events.length);
    await page.setInputFiles('#file', opts.wav);
    const boxes = [];
    for (let i = 0; i < 5; i++) {
      await page.waitForFunction((n) => window.lipstreamPlayer.stats.speechFramesShown > n, 4 + i * 5, { timeout: timeoutMs, polling: 20 });
      boxes.push(await page.evaluate(() => {
        const view = window.lipstreamPlayer.patchView;
        const log = view.cstats.log;
        const { width, height } = view.canvas;
        const data = view.canvas.getContext('2d').getImageData(0, 0, width, height).data;
        let x1 = width; let y1 = height; let x2 = -1; let y2 = -1;
        for (let y = 0; y < height; y++) for (let x = 0; x < width; x++) {
          if (data[(y * width + x) * 4 + 3]) { x1 = Math.min(x1, x); y1 = Math.min(y1, y); x2 = Math.max(x2, x + 1); y2 = Math.max(y2, y + 1); }
        }
        return { overlay: x2 < 0 ? null : [x1, y1, x2, y2], entry: log[log.length - 1] };
      }));
    }
    await waitFinished(page, before);
    result = { boxes, snap: await snapshot(page) };
  } else if (scenario === 'interrupt') {
    const { page } = await openPage();
    await page.fill('#text', opts.text || 'This sentence is long enough to be cut off in the middle. '.repeat(4));
    await page.click('#speak');
    await page.waitForFunction(() => window.lipstreamPlayer.stats.speechFramesShown > 12, null, { timeout: timeoutMs, polling: 20 });
    await page.click('#interrupt');
    await page.waitForFunction(() => window.lipstreamPlayer.stats.interruptMs != null, null, { timeout: 10000 });
    await page.waitForTimeout(500);
    const speechAfter = await page.evaluate(() => window.lipstreamPlayer.stats.speechFramesShown);
    const mouthAfter = await page.evaluate(() => {
      const { width, height } = window.lipstreamPlayer.canvas;
      const data = window.lipstreamPlayer.canvas.getContext('2d').getImageData(0, 0, width, height).data;
      let n = 0;
      for (let i = 3; i < data.length; i += 4) if (data[i]) n += 1;
      return n;
    });
    await page.waitForTimeout(500);
    // and the session goes on: a second utterance plays
    const before = await page.evaluate(() => window.lipstreamPlayer.stats.events.length);
    await page.fill('#text', 'And again.');
    await page.click('#speak');
    await waitFinished(page, before);
    const snap = await snapshot(page);
    result = { snap, speechStable: speechAfter, mouthPixelsAfter: mouthAfter };
  } else if (scenario === 'bad_mode') {
    const page = await browser.newPage();
    await page.goto(`${opts.url}/?avatar=${opts.avatar}`);
    result = await page.evaluate(async (avatar) => {
      const { LivePlayer } = await import('/static/player.js');
      const player = new LivePlayer(document.querySelector('#video'));
      const t0 = performance.now();
      try {
        await player.connect(`ws://${location.host}/ws`, { avatar, stream: 'hologram' });
        return { ok: true };
      } catch (err) {
        return { ok: false, message: err.message, ms: performance.now() - t0, errors: player.stats.errors };
      }
    }, opts.avatar);
  } else if (scenario === 'base_fails') {
    const context = await browser.newContext();
    await context.route('**/edge/*/data/base.mp4', (route) => route.fulfill({ status: 404, body: 'gone' }));
    const { page } = await openPage({ context, waitBase: false });
    await page.waitForFunction(() => /base loop failed/.test(document.querySelector('#status').textContent), null, { timeout: 30000 });
    const failedStatus = await page.textContent('#status');
    // it falls back to full frames: frames play and speech works
    await page.waitForFunction(() => window.lipstreamPlayer.ready?.stream === 'full' && window.lipstreamPlayer.stats.framesShown > 5, null, { timeout: 30000 });
    const before = await page.evaluate(() => window.lipstreamPlayer.stats.events.length);
    await page.fill('#text', 'Still here.');
    await page.click('#speak');
    await waitFinished(page, before);
    result = { failedStatus, status: await page.textContent('#status'), snap: await snapshot(page) };
  } else {
    throw new Error(`unknown scenario ${scenario}`);
  }
  printResult(result, problems);
} catch (err) {
  printFailure(err, problems);
} finally {
  await browser.close();
}

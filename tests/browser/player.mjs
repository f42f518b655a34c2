// Drives the real player page in headless Debian Chromium and prints one JSON result line.
// Usage: node player.mjs '{"url": "http://127.0.0.1:PORT", "scenario": "speak", "avatars": ["small"], ...}'
import { launchChromium, printFailure, printResult } from './chromium.mjs';

const opts = JSON.parse(process.argv[2] || '{}');
const scenario = opts.scenario || 'speak';
const timeoutMs = opts.timeoutMs || 90000;

const browser = await launchChromium();

const problems = [];

async function openPage(avatar) {
  const page = await browser.newPage();
  page.on('pageerror', (err) => problems.push(`pageerror: ${err.message}`));
  page.on('console', (msg) => { if (msg.type() === 'error') problems.push(`console: ${msg.text()}`); });
  const query = new URLSearchParams({ avatar, ...(opts.token ? { token: opts.token } : {}), ...(opts.width ? { width: String(opts.width) } : {}), ...(opts.stream ? { stream: opts.stream } : {}), ...(opts.audio ? { audio: opts.audio } : {}) });
  await page.goto(`${opts.url}/?${query}`);
  await page.waitForFunction((name) => [...document.querySelector('#avatar').options].some((o) => o.value === name), avatar);
  await page.selectOption('#avatar', avatar);
  await page.click('#start');
  await page.waitForFunction(() => !document.querySelector('#speak').disabled, null, { timeout: 30000 });
  return page;
}

const snapshot = (page) => page.evaluate(() => window.lipstreamPlayer.snapshot());

async function speakAndWait(page, text) {
  await page.waitForFunction(() => window.lipstreamPlayer.stats.framesShown > 10, null, { timeout: 30000 });
  await page.fill('#text', text);
  const before = await page.evaluate(() => window.lipstreamPlayer.stats.events.length);
  await page.click('#speak');
  await page.waitForFunction(
    (n) => window.lipstreamPlayer.stats.events.slice(n).some((e) => e.type === 'playback_finished'),
    before, { timeout: timeoutMs, polling: 100 });
  await page.waitForTimeout(300); // a few idle frames after the end, then report
  await page.evaluate(() => window.lipstreamPlayer._reportStats());
  return snapshot(page);
}

let result;
try {
  if (scenario === 'speak') {
    const page = await openPage(opts.avatars[0]);
    const snap = await speakAndWait(page, opts.text || 'Hello from the browser.');
    await page.waitForTimeout(300);
    const status = await page.textContent('#status');
    const statsText = await page.textContent('#s-offset');
    result = { snap, status, statsText };
  } else if (scenario === 'interrupt') {
    const page = await openPage(opts.avatars[0]);
    await page.waitForFunction(() => window.lipstreamPlayer.stats.framesShown > 10, null, { timeout: 30000 });
    await page.fill('#text', opts.text || 'This sentence is long enough to be cut off in the middle. '.repeat(4));
    await page.click('#speak');
    await page.waitForFunction(() => window.lipstreamPlayer.stats.speechFramesShown > 12, null, { timeout: timeoutMs, polling: 20 });
    await page.click('#interrupt');
    await page.waitForFunction(() => window.lipstreamPlayer.stats.interruptMs != null, null, { timeout: 10000 });
    await page.waitForTimeout(500);
    const speechAfter = await page.evaluate(() => window.lipstreamPlayer.stats.speechFramesShown);
    await page.waitForTimeout(500);
    const snap = await snapshot(page);
    result = { snap, speechStable: snap.speechFramesShown === speechAfter };
  } else if (scenario === 'two') {
    const pages = await Promise.all(opts.avatars.map((a) => openPage(a)));
    const snaps = await Promise.all(pages.map((p, i) => speakAndWait(p, opts.text || `Session number ${i + 1} speaking.`)));
    const readies = await Promise.all(pages.map((p) => p.evaluate(() => window.lipstreamPlayer.ready)));
    result = { snaps, readies };
  } else if (scenario === 'pages') {
    // benchmarks/scenarios/opus.py: N pages at once; a snapshot before speaking and one after, per page
    const pages = await Promise.all(opts.avatars.map((a) => openPage(a)));
    await Promise.all(pages.map((p) => p.waitForFunction(() => window.lipstreamPlayer.stats.framesShown > 10, null, { timeout: 30000 })));
    const slim = ({ patch, events, ...rest }) => ({ ...rest, events: events.length, compositorMs: patch?.compositorMs ?? [] });
    const before = (await Promise.all(pages.map((p) => snapshot(p)))).map(slim);
    const snaps = (await Promise.all(pages.map((p, i) => speakAndWait(p, opts.text || `Session number ${i + 1} speaking.`)))).map(slim);
    result = { before, snaps };
  } else {
    throw new Error(`unknown scenario ${scenario}`);
  }
  printResult(result, problems);
} catch (err) {
  printFailure(err, problems);
} finally {
  await browser.close();
}

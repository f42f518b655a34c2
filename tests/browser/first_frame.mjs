// Drives the live player page (whole-frame or patch stream) in headless Debian Chromium: speaks each text of
// `texts` in turn, `repeats` times, and reads the page's own speak -> first speech frame shown time; each text
// is interrupted once its first speech frame is on screen. Prints one JSON result line (with each speak's page
// stages, `stages`, and the player's A/V offset, `avOffsetMs`).
// Usage: node first_frame.mjs '{"url": "http://127.0.0.1:PORT", "avatar": "sample", "stream": "full",
//                              "texts": ["Good evening.", ...], "repeats": 3}'
// For benchmarks/scenarios/first_frame.py.
import { launchChromium, printFailure, printResult } from './chromium.mjs';

const opts = JSON.parse(process.argv[2] || '{}');
const timeoutMs = opts.timeoutMs || 60000;
const browser = await launchChromium();
const problems = [];
const stages = []; // per speak, in order: the page's marks (player.firstSpeech)

async function openPage() {
  const page = await browser.newPage({ viewport: { width: 1000, height: 1000 } });
  page.on('pageerror', (err) => problems.push(`pageerror: ${err.message}`));
  page.on('console', (msg) => { if (msg.type() === 'error') problems.push(`console: ${msg.text()}`); });
  const query = new URLSearchParams({ avatar: opts.avatar, stream: opts.stream || 'full' });
  await page.goto(`${opts.url}/?${query}`);
  await page.waitForFunction((name) => [...document.querySelector('#avatar').options].some((o) => o.value === name), opts.avatar);
  await page.selectOption('#avatar', opts.avatar);
  await page.click('#start');
  await page.waitForFunction(() => !document.querySelector('#speak').disabled, null, { timeout: timeoutMs });
  await page.waitForFunction(() => window.lipstreamPlayer.stats.framesShown > 10, null, { timeout: timeoutMs });
  return page;
}

/** Speak one text; the page's speak -> first speech frame shown (ms), then interrupt and let it idle. */
async function firstFrame(page, text) {
  const before = await page.evaluate(() => window.lipstreamPlayer.stats.events.length);
  const lateBefore = await page.evaluate(() => window.lipstreamPlayer.stats.audioLate);
  await page.fill('#text', text);
  await page.click('#speak');
  await page.waitForFunction(() => window.lipstreamPlayer.stats.ttffMs != null, null, { timeout: timeoutMs, polling: 20 });
  const ms = await page.evaluate(() => window.lipstreamPlayer.stats.ttffMs);
  await page.waitForTimeout(200); // a late mark (the first speech patch decoded after a rest note) comes in
  // audio re-anchors (a sound that came after its time) from the speak to here, the first speech's among them
  stages.push(await page.evaluate((n) => ({ ...window.lipstreamPlayer.firstSpeech.marks,
    audioLate: window.lipstreamPlayer.stats.audioLate - n }), lateBefore));
  await page.click('#interrupt');
  await page.waitForFunction(
    (n) => window.lipstreamPlayer.stats.events.slice(n).some((e) => e.type === 'playback_finished'),
    before, { timeout: timeoutMs, polling: 50 });
  await page.waitForTimeout(opts.idleMs || 600); // the server's speech pool idles before the next text
  return ms;
}

try {
  const page = await openPage();
  const runs = opts.texts.map(() => []);
  for (let r = 0; r < (opts.repeats || 3); r++) {
    for (let i = 0; i < opts.texts.length; i++) runs[i].push(await firstFrame(page, opts.texts[i]));
  }
  printResult({ stream: await page.evaluate(() => window.lipstreamPlayer.ready.stream), runs, stages,
    avOffsetMs: await page.evaluate(() => window.lipstreamPlayer.offsetSummary()) }, problems);
} catch (err) {
  printFailure(err, problems);
} finally {
  await browser.close();
}

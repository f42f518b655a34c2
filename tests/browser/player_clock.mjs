// The page player's audio clock under lateness (tests/test_browser_player.py): the real player.js in headless
// Chromium, fed 40 ms chunks around its anchor. Prints the player's counters after each case.
import fs from 'node:fs';
import path from 'node:path';
import { launchChromium, printFailure, printResult } from './chromium.mjs';

const WEB = path.resolve(path.dirname(new URL(import.meta.url).pathname), '../../lipstream/web');
const HARNESS = '<!doctype html><meta charset=utf-8><title>player clock</title><link rel=icon href="data:,">';
const problems = [];
const browser = await launchChromium();
try {
  const page = await browser.newPage();
  page.on('pageerror', (err) => problems.push(`pageerror: ${err.message}`));
  await page.route('http://lipstream.test/**', (route) => {
    const name = new URL(route.request().url()).pathname.slice(1);
    if (name === 'static/harness.html') return route.fulfill({ body: HARNESS, contentType: 'text/html' });
    // as the server maps them: /static/ the player's folder, /static/edge/ the serverless page's shared modules
    const file = path.join(WEB, name.replace(/^static\/edge\//, 'edge/'));
    if (!file.startsWith(WEB) || !fs.existsSync(file)) return route.fulfill({ status: 404 });
    return route.fulfill({ body: fs.readFileSync(file), contentType: 'text/javascript' });
  });
  page.on('requestfailed', (r) => problems.push(`failed: ${r.url()} ${r.failure()?.errorText}`));
  await page.goto('http://lipstream.test/static/harness.html');
  const result = await page.evaluate(async () => {
    const { LivePlayer } = await import('./player.js');
    const player = new LivePlayer(document.createElement('canvas'));
    await player.unlockAudio();
    player._sources = new Set(); // what opening a session sets up (no server here)
    player._audioEnd = 0;
    const rate = 16000;
    const tone = () => Float32Array.from({ length: 640 }, (_, i) => 0.3 * Math.sin(i / 5));
    const silence = () => new Float32Array(640);
    // a chunk whose sound is due `late` seconds before now (negative: after now)
    const play = (late, samples) => {
      const due = player.ac.currentTime - late;
      const pts = Math.round(player._anchor.pts + (due - player._anchor.time) * rate);
      player._play({ pts, samples, rate, lead: 0, trim: 0 });
      return pts;
    };
    const counters = () => ({ late: player.stats.audioLate, silence: player.stats.lateSilence,
      trimmed: player.stats.audioTrimmed, anchor: { ...player._anchor }, audioEnd: player._audioEnd });
    const cases = {};
    player._play({ pts: 0, samples: tone(), rate, lead: 0, trim: 0 }); // the first chunk anchors the clock
    cases.anchored = counters();
    await new Promise((resolve) => { setTimeout(resolve, 400); }); // the clock runs past that first chunk
    const silentPts = play(0.05, silence());
    cases.lateSilence = { ...counters(), pts: silentPts };
    play(0.015, tone());
    cases.slightlyLate = counters();
    play(-0.1, tone());
    cases.onTime = counters();
    play(0.1, tone());
    cases.veryLate = counters();
    return cases;
  });
  printResult(result, problems);
} catch (err) {
  printFailure(err, problems);
} finally {
  await browser.close();
}

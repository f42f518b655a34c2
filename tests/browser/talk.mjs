// Drives the page's Talk mode in headless Chromium with a real microphone stream: Chromium's fake capture device
// plays a WAV file as the mic. Prints one JSON result line.
// Usage: node talk.mjs '{"url": "http://127.0.0.1:PORT", "scenario": "talk"|"barge_in"|"no_mic", "wav": "/abs/q.wav",
//                        "avatar": "small", "stopAfterCaptions": 2, "mic": "pcm"|"opus"}'
// barge_in is also the benchmark's barge-in figure: `bargeInMs` (onset where the server's VAD put it) and
// `bargeInLevelMs` (onset where the page's mic level first rose), both to the last avatar speech frame shown.
import { chromium } from 'playwright-core';

const opts = JSON.parse(process.argv[2] || '{}');
const scenario = opts.scenario || 'talk';
const timeoutMs = opts.timeoutMs || 45000;
const SAMPLE_RATE = 16000;

const args = ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
  '--disable-component-update', '--disable-sync', '--autoplay-policy=no-user-gesture-required'];
if (opts.wav) {
  // The fake device loops the file: the WAVs end in enough silence that a scenario is over before it wraps.
  args.push('--use-fake-ui-for-media-stream', '--use-fake-device-for-media-stream', `--use-file-for-fake-audio-capture=${opts.wav}`);
}
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/lib/chromium/chromium', headless: true, args });
const problems = [];
let lastPage = null; // for the failure report

/** Open the page on an agent server and install page-side probes (they read the DOM right after each event). */
async function openPage(initScript) {
  const context = await browser.newContext();
  if (initScript) await context.addInitScript(initScript);
  const page = await context.newPage();
  lastPage = page;
  page.on('pageerror', (err) => problems.push(`pageerror: ${err.message}`));
  page.on('console', (msg) => { if (msg.type() === 'error') problems.push(`console: ${msg.text()}`); });
  const avatar = opts.avatar || 'small';
  await page.goto(`${opts.url}/?${new URLSearchParams({ avatar, ...(opts.mic ? { mic: opts.mic } : {}) })}`);
  await page.waitForFunction((name) => !document.querySelector('#talk').hidden
    && [...document.querySelector('#avatar').options].some((o) => o.value === name), avatar, { timeout: 15000 });
  await page.selectOption('#avatar', avatar);
  await page.evaluate(() => {
    const p = window.lipstreamPlayer;
    window.__probe = { transcripts: [], captions: [], decisions: [], states: [] };
    p.addEventListener('state', (e) => {
      const el = document.querySelector('#states');
      window.__probe.states.push({ ...e.detail, shown: el.textContent, dataAgent: el.dataset.agent });
    });
    p.addEventListener('turn_decision', (e) => {
      window.__probe.decisions.push({ ...e.detail, micState: document.querySelector('#mic-state').textContent });
    });
    // Listeners added after the page's own: the DOM already shows what the event did.
    p.addEventListener('transcript', (e) => {
      const li = [...document.querySelectorAll('#conversation li.user')].pop();
      window.__probe.transcripts.push({ ...e.detail, at: performance.now(), domText: li && li.textContent,
        domPartial: li ? li.classList.contains('partial') : null });
    });
    p.addEventListener('reply_text', (e) => {
      const d = e.detail;
      const rec = { text: d.text, turn: d.turn, position: d.position_samples, clock: p.clockPts(), at: performance.now(),
        captionShown: document.querySelector('#caption').textContent === d.text, speakingLater: false, shownPtsLater: null };
      window.__probe.captions.push(rec);
      // A caption is in sync when the speech frames around its position are what the screen shows: looked at
      // every 40 ms for 400 ms (a voice's lead-in is quiet, and on a loaded 2-core box a frame may come late).
      const shownAt = performance.now();
      const look = () => {
        if (p.speaking && !rec.speakingLater) rec.speakingAfterMs = Math.round(performance.now() - shownAt);
        rec.speakingLater = rec.speakingLater || p.speaking;
        rec.shownPtsLater = p.lastShownPts;
        if (!rec.speakingLater && performance.now() - shownAt < 400) setTimeout(look, 40);
      };
      setTimeout(look, 40);
    });
  });
  return page;
}

const state = (page) => page.evaluate(() => ({
  snap: window.lipstreamPlayer.snapshot(),
  probe: window.__probe,
  bargeIns: window.lipstreamTalk.bargeIns,
  micRate: window.lipstreamMic ? window.lipstreamMic.rate : null,
  micSeconds: window.lipstreamMic ? window.lipstreamMic.sent16k / 16000 : null,
  talkVisible: !!document.querySelector('#talk').checkVisibility(),
  micButtonVisible: !!document.querySelector('#mic').checkVisibility(),
  conversation: [...document.querySelectorAll('#conversation li')].map((li) => ({ cls: li.className, text: li.textContent })),
  turns: [...document.querySelectorAll('#turns tbody tr')].map((tr) => [...tr.cells].map((c) => c.textContent)),
  waterfalls: [...document.querySelectorAll('#turns .waterfall')].map((w) => [...w.children].map((b) => b.dataset.stage)),
  caption: document.querySelector('#caption').textContent,
  micState: document.querySelector('#mic-state').textContent,
  status: document.querySelector('#status').textContent,
}));

const waitFor = (page, fn, arg, ms = timeoutMs) => page.waitForFunction(fn, arg, { timeout: ms, polling: 20 });

/** First mic chunk louder than `threshold` after wall time `after`: the user's own speech onset, from the page's mic. */
const levelOnset = (page, after, threshold = 0.02) => page.evaluate(([t0, th]) => {
  const hit = window.lipstreamMic.log.find((c) => c.at > t0 && c.peak > th);
  return hit ? hit.at - 20 : null; // a chunk is posted when its 20 ms are in: its first sample is 20 ms older
}, [after, threshold]);

async function talk() {
  const page = await openPage();
  await page.click('#talk-btn');
  await waitFor(page, () => window.lipstreamMic && window.lipstreamMic.active, null, 15000);
  if (opts.screenshotPartial) {
    await waitFor(page, () => window.__probe.transcripts.some((t) => t.kind === 'partial' && t.text.trim()), null);
    await page.screenshot({ path: opts.screenshotPartial });
  }
  const nCaptions = opts.stopAfterCaptions || 2;
  await waitFor(page, (n) => window.__probe.captions.length >= n, nCaptions);
  if (opts.screenshot) await page.screenshot({ path: opts.screenshot });
  await page.waitForTimeout(400); // well inside the sentence, then Stop
  await page.click('#stop');
  await waitFor(page, () => window.lipstreamPlayer.stats.interruptMs != null, null, 5000);
  const speechAfter = await page.evaluate(() => window.lipstreamPlayer.stats.speechFramesShown);
  await page.waitForTimeout(700);
  await page.evaluate(() => window.lipstreamPlayer._reportStats());
  const s = await state(page);
  s.speechStable = s.snap.speechFramesShown === speechAfter;
  if (opts.screenshotAfter) await page.screenshot({ path: opts.screenshotAfter });
  return s;
}

async function bargeIn() {
  const page = await openPage();
  await page.click('#talk-btn');
  await waitFor(page, () => window.lipstreamMic && window.lipstreamMic.active, null, 15000);
  // The answer to the first question is playing...
  await waitFor(page, () => window.__probe.captions.length >= 1 && window.lipstreamPlayer.speaking, null);
  const answerAt = await page.evaluate(() => window.__probe.captions[0].at);
  // ...when the second question starts (the WAV's timing); the page measures onset -> last speech frame shown.
  await waitFor(page, () => window.lipstreamTalk.bargeIns.length >= 1, null);
  if (opts.screenshot) await page.screenshot({ path: opts.screenshot });
  const s = await state(page);
  const onset = await levelOnset(page, answerAt + 300);
  const b = s.bargeIns[0];
  const cut = s.snap.events.find((e) => e.type === 'playback_finished' && e.interrupted && e.at >= b.onsetAt);
  s.bargeInMs = b.ms;
  s.bargeInLevelMs = onset == null ? null : b.onsetAt - onset + b.ms;
  // Where the time goes: VAD onset -> the server's cut reaches the page -> the frames still due before the cut.
  s.bargeInBreakdown = cut ? {
    onsetToCutMs: cut.at - b.onsetAt,
    cutToLastFrameMs: b.onsetAt + b.ms - cut.at,
    cutAheadOfClockMs: (cut.position_samples - cut.clock) / (SAMPLE_RATE / 1000),
    levelOnsetBeforeVadMs: onset == null ? null : b.onsetAt - onset,
  } : null;
  return s;
}

/** The page says clearly when the microphone is refused or absent (getUserMedia rejects with that name). */
async function noMic() {
  const out = {};
  for (const name of ['NotAllowedError', 'NotFoundError']) {
    const page = await openPage(`navigator.mediaDevices.getUserMedia = () => Promise.reject(new DOMException('no', '${name}'));`);
    await page.click('#talk-btn');
    await waitFor(page, () => !document.querySelector('#mic-error').hidden, null, 15000);
    out[name] = await page.evaluate(() => ({ notice: document.querySelector('#mic-error').textContent,
      talk: document.querySelector('#talk-btn').textContent, micState: document.querySelector('#mic-state').textContent }));
    if (opts.screenshot && name === 'NotAllowedError') await page.screenshot({ path: opts.screenshot });
    await page.context().close();
  }
  return out;
}

/** On a server without --agent the page is the plain one: no Talk panel, the plain Microphone button. */
async function plain() {
  const page = await browser.newPage();
  lastPage = page;
  page.on('pageerror', (err) => problems.push(`pageerror: ${err.message}`));
  await page.goto(`${opts.url}/?avatar=${opts.avatar || 'small'}`);
  await page.waitForFunction(() => document.querySelector('#avatar').options.length > 0, null, { timeout: 15000 });
  await page.waitForTimeout(300); // /healthz answered before the avatars: the panel decision is made
  return { talkVisible: await page.isVisible('#talk'), captionVisible: await page.isVisible('#caption'),
    micVisible: await page.isVisible('#mic'), status: await page.textContent('#status') };
}

let result;
try {
  if (scenario === 'talk') result = await talk();
  else if (scenario === 'barge_in') result = await bargeIn();
  else if (scenario === 'no_mic') result = await noMic();
  else if (scenario === 'plain') result = await plain();
  else throw new Error(`unknown scenario ${scenario}`);
  result.problems = problems;
  result.sampleRate = SAMPLE_RATE;
  console.log(JSON.stringify(result));
} catch (err) {
  let at = null;
  try { at = lastPage && await state(lastPage); } catch { /* the page is gone */ }
  console.log(JSON.stringify({ failed: String(err && err.stack || err), problems, state: at }));
  process.exitCode = 1;
} finally {
  await browser.close();
}

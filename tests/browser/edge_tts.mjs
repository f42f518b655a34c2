// Drives the serverless page's text input (docs/web-export.md, "Text") in headless Debian Chromium and
// prints one JSON result line.
// Usage: node edge_tts.mjs '{"url": "http://127.0.0.1:PORT/", "scenario": "phonemes", "texts": [...]}'
// Scenarios: phonemes (ids per sentence, from the page's TTS worker), audio (raw voice-rate audio and 16 kHz
// audio per text, written as float32 files to outDir), speak (typed text end to end: first audio, patches,
// playback), bad_text (the page's messages for each of `texts`), unavailable (what the page says about text).
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { launchChromium } from './chromium.mjs';

const opts = JSON.parse(process.argv[2] || '{}');
const timeoutMs = opts.timeoutMs || 60000;
const browser = await launchChromium();
const problems = [];

async function openPage() {
  const page = await browser.newPage({ viewport: { width: 1000, height: 1000 } });
  page.on('pageerror', (err) => problems.push(`pageerror: ${err.message}`));
  page.on('console', (msg) => { if (msg.type() === 'error') problems.push(`console: ${msg.text()}`); });
  await page.goto(opts.url);
  // text is ready (or said unavailable) after the engine: wait for that event or an error
  await page.waitForFunction(() => {
    const s = window.lipstreamEdge && window.lipstreamEdge.stats;
    return (s && s.events.some((e) => e.type === 'text_ready' || e.type === 'text_unavailable'))
      || document.querySelector('#error').textContent;
  }, null, { timeout: timeoutMs });
  return page;
}

const pageState = (page) => page.evaluate(() => ({
  error: document.querySelector('#error').textContent,
  textnote: document.querySelector('#textnote').textContent,
  textDisabled: document.querySelector('#text').disabled,
  status: document.querySelector('#status').textContent,
  mode: window.lipstreamEdge.stats.textMode || null,
}));

async function run() {
  const page = await openPage();
  const state = await pageState(page);
  if (opts.scenario === 'unavailable') return { state };
  if (state.error || state.textDisabled) return { state };
  if (opts.scenario === 'phonemes') {
    const sentences = [];
    for (const text of opts.texts) {
      const out = await page.evaluate((t) => window.lipstreamEdge.tts.phonemes(t), text);
      sentences.push(out.map((s) => ({ ids: s.ids, missing: s.missing, phonemes: s.phonemes.join('') })));
    }
    return { state, sentences };
  }
  if (opts.scenario === 'audio') {
    const files = [];
    for (let i = 0; i < opts.texts.length; i++) {
      const got = await page.evaluate(async (t) => {
        const parts = [];
        const t0 = performance.now();
        let first = null;
        await window.lipstreamEdge.tts.speak(t, (s) => {
          if (first === null) first = performance.now() - t0;
          parts.push({ pcm: Array.from(s.pcm), pcm16: Array.from(s.pcm16), rate: s.rate, synthMs: s.synthMs });
        });
        return { parts, firstMs: first, totalMs: performance.now() - t0 };
      }, opts.texts[i]);
      const raw = got.parts.flatMap((p) => p.pcm);
      const pcm16 = got.parts.flatMap((p) => p.pcm16);
      writeFileSync(join(opts.outDir, `raw_${i}.f32`), Buffer.from(Float32Array.from(raw).buffer));
      writeFileSync(join(opts.outDir, `pcm16_${i}.f32`), Buffer.from(Float32Array.from(pcm16).buffer));
      files.push({ sentences: got.parts.length, rate: got.parts[0].rate, firstMs: got.firstMs, totalMs: got.totalMs,
        synthMs: got.parts.map((p) => p.synthMs), samples: raw.length });
    }
    return { state, files, threads: await page.evaluate(() => window.lipstreamEdge.stats.ttsThreads) };
  }
  if (opts.scenario === 'speak') {
    await page.fill('#text', opts.texts[0]);
    const before = await page.evaluate(() => window.lipstreamEdge.stats.events.length);
    await page.click('#speak');
    await page.waitForFunction((n) => {
      const ev = window.lipstreamEdge.stats.events.slice(n);
      return ev.some((e) => e.type === 'playback_finished' || e.type === 'error');
    }, before, { timeout: timeoutMs, polling: 100 });
    const stats = await page.evaluate((n) => {
      const s = window.lipstreamEdge.stats;
      return { events: s.events.slice(n), patches: s.patches, speechFramesShown: s.speechFramesShown, framesShown: s.framesShown,
        firstAudioMs: s.firstSentenceAt === null ? null : s.firstSentenceAt - s.textAt,
        firstMouthMs: s.firstMouthAt === null || s.firstMouthAt === undefined ? null : s.firstMouthAt - s.textAt,
        sentences: s.sentences || null, late: s.late, skipped: s.skipped };
    }, before);
    if (opts.screenshot) await page.screenshot({ path: opts.screenshot });
    return { state: await pageState(page), stats };
  }
  if (opts.scenario === 'bad_text') {
    const messages = [];
    for (const text of opts.texts) {
      await page.evaluate(() => { document.querySelector('#error').textContent = ''; });
      await page.fill('#text', text);
      await page.click('#speak');
      await page.waitForFunction(() => document.querySelector('#error').textContent, null, { timeout: 10000 });
      messages.push(await page.textContent('#error'));
    }
    return { state, messages };
  }
  throw new Error(`unknown scenario ${opts.scenario}`);
}

let result;
try {
  result = await run();
} catch (err) {
  result = { failed: err.message };
  process.exitCode = 1;
}
result.problems = problems;
console.log(JSON.stringify(result));
await browser.close();

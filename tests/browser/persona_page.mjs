// The page as a visitor first sees it: the avatar's idle picture the moment the page opens (no black box); on an
// agent server with a persona, its name, and after Talk its greeting captioned. Writes screenshots (opened.png,
// greeting.png) to `out`; prints one JSON line.
// Usage: node persona_page.mjs '{"url": "http://127.0.0.1:PORT", "avatar": "small", "out": "/tmp/shots", "agent": true}'
// (agent false: a plain server, the poster alone)
import { chromium } from 'playwright-core';

const opts = JSON.parse(process.argv[2] || '{}');
const agent = opts.agent !== false;
const args = ['--no-sandbox', '--disable-gpu', '--disable-quic', '--autoplay-policy=no-user-gesture-required',
  '--use-fake-ui-for-media-stream', '--use-fake-device-for-media-stream'];
const browser = await chromium.launch({ executablePath: process.env.CHROMIUM || '/usr/lib/chromium/chromium', headless: true, args });
const problems = [];

async function visit(page) {
  page.on('pageerror', (err) => problems.push(`pageerror: ${err.message}`));
  await page.goto(`${opts.url}/?avatar=${opts.avatar || 'small'}`);
  await page.waitForFunction((withPersona) => (!withPersona || !document.querySelector('#persona').hidden)
    && document.querySelector('#video').style.backgroundImage, agent, { timeout: 20000 });
  const poster = await page.evaluate(async () => {
    const url = document.querySelector('#video').style.backgroundImage.slice(5, -2);
    const img = new Image();
    img.src = url;
    await img.decode(); // the poster really loads: the avatar's picture, not a broken link
    return { url, width: img.naturalWidth, height: img.naturalHeight };
  });
  await page.screenshot({ path: `${opts.out}/opened.png` });
  const opened = await page.evaluate(() => ({ persona: document.querySelector('#persona').textContent,
    personaHidden: document.querySelector('#persona').hidden, title: document.title,
    talkVisible: !document.querySelector('#talk').hidden }));
  if (!agent) return { poster, ...opened };
  await page.click('#talk-btn');
  await page.waitForFunction(() => document.querySelector('#caption').textContent.length > 0, null, { timeout: 60000 });
  await page.waitForTimeout(1500);
  await page.screenshot({ path: `${opts.out}/greeting.png` });
  return { poster, ...opened, caption: await page.evaluate(() => document.querySelector('#caption').textContent) };
}

try {
  const result = await visit(await browser.newPage({ viewport: { width: 1100, height: 800 } }));
  console.log(JSON.stringify({ ok: problems.length === 0, ...result, problems }));
} catch (err) {
  console.log(JSON.stringify({ ok: false, failed: String(err), problems }));
  process.exitCode = 1;
} finally {
  await browser.close();
}

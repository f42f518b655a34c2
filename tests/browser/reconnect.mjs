// The player page behind Ray Serve: open a session, kill the replica that holds it (SIGKILL, its pid listed by
// /healthz), and check the page reconnects by itself to a live replica, says so, and speaks again.
// Usage: node reconnect.mjs '{"url": "http://127.0.0.1:PORT", "avatar": "small", "screenshot": "/tmp/x.png"}'
import { launchChromium } from './chromium.mjs';

const opts = JSON.parse(process.argv[2] || '{}');
const browser = await launchChromium();
const problems = [];

/** {replica id: pid} of both replicas, as /healthz lists them (the application's board's view, whichever
 * replica the proxy picks to answer). */
async function replicaPids() {
  let pids = {};
  for (let i = 0; i < 60 && Object.keys(pids).length < 2; i += 1) {
    pids = (await (await fetch(`${opts.url}/healthz`)).json()).replicas;
    if (Object.keys(pids).length < 2) await new Promise((r) => setTimeout(r, 500));
  }
  return pids;
}

let result;
try {
  const pids = await replicaPids();
  const page = await browser.newPage();
  page.on('pageerror', (err) => problems.push(`pageerror: ${err.message}`));
  await page.goto(`${opts.url}/?avatar=${opts.avatar}`);
  await page.waitForFunction((name) => [...document.querySelector('#avatar').options].some((o) => o.value === name), opts.avatar);
  await page.selectOption('#avatar', opts.avatar);
  await page.click('#start');
  await page.waitForFunction(() => window.lipstreamPlayer.stats.framesShown > 10, null, { timeout: 60000 });
  const first = await page.evaluate(() => window.lipstreamPlayer.ready.replica);
  await page.evaluate(() => {
    const p = window.lipstreamPlayer;
    window.reconnectLog = [];
    for (const type of ['closed', 'reconnecting', 'reconnected']) {
      p.addEventListener(type, (e) => window.reconnectLog.push({ type, at: performance.now(), ...e.detail, ready: undefined }));
    }
  });
  const pid = pids[first];
  if (!pid) throw new Error(`no pid for replica ${first}: ${JSON.stringify(pids)}`);
  const killedAt = await page.evaluate(() => performance.now());
  process.kill(pid, 'SIGKILL');
  await page.waitForFunction(() => window.reconnectLog.some((e) => e.type === 'reconnecting'), null, { timeout: 30000 });
  const statusWhileDown = await page.textContent('#status');
  await page.waitForFunction(() => window.reconnectLog.some((e) => e.type === 'reconnected'), null, { timeout: 60000 });
  const framesBefore = await page.evaluate(() => window.lipstreamPlayer.stats.framesShown);
  await page.waitForFunction((n) => window.lipstreamPlayer.stats.framesShown > n + 5, framesBefore, { timeout: 30000 });
  const streamingAgainAt = await page.evaluate(() => performance.now());
  const statusAfter = await page.textContent('#status');
  const second = await page.evaluate(() => window.lipstreamPlayer.ready.replica);
  await page.fill('#text', 'Back on a live replica.');
  const before = await page.evaluate(() => window.lipstreamPlayer.stats.events.length);
  await page.click('#speak');
  await page.waitForFunction(
    (n) => window.lipstreamPlayer.stats.events.slice(n).some((e) => e.type === 'playback_finished'),
    before, { timeout: 60000, polling: 100 });
  if (opts.screenshot) await page.screenshot({ path: opts.screenshot });
  const log = await page.evaluate(() => window.reconnectLog);
  result = {
    first, second, statusWhileDown, statusAfter, log,
    streamingAgainMs: Math.round(streamingAgainAt - killedAt),
    speechFramesShown: await page.evaluate(() => window.lipstreamPlayer.stats.speechFramesShown),
  };
} catch (err) {
  result = { failed: `${err.message}`, problems };
}
await browser.close();
if (!result.failed && problems.length) result.failed = problems.join('; ');
console.log(JSON.stringify(result));
process.exit(result.failed ? 1 : 0);

// One headless Chromium for every driver script a test module runs (tests/fixtures_browser.py starts it once per
// module): it prints its WebSocket endpoint as one JSON line and stays up until its stdin closes. The scripts'
// launchChromium() connects to it (LIPSTREAM_CHROMIUM_WS) instead of starting a browser of their own each time.
import { chromium } from 'playwright-core';
import { chromiumArgs } from './chromium.mjs';

const server = await chromium.launchServer({
  executablePath: process.env.CHROMIUM || '/usr/lib/chromium/chromium', headless: true, args: chromiumArgs(),
});
console.log(JSON.stringify({ wsEndpoint: server.wsEndpoint() }));
process.stdin.resume();
process.stdin.on('end', async () => { await server.close(); process.exit(0); });

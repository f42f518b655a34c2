// What every browser test script shares: headless Debian Chromium with the flags these machines need
// (../shared/reference/browser-stack.md), and the one JSON line each script prints.
import { chromium } from 'playwright-core';

/** The flags every test browser gets; `autoplay` lets audio start unclicked. */
export function chromiumArgs(extraArgs = [], { autoplay = true } = {}) {
  return ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
    '--disable-component-update', '--disable-sync',
    ...(autoplay ? ['--autoplay-policy=no-user-gesture-required'] : []), ...extraArgs];
}

/** Headless Chromium; `extraArgs` adds flags (WebGPU, a fake microphone); `autoplay` lets audio start unclicked.
 * With the default flags and LIPSTREAM_CHROMIUM_WS set (browser_server.mjs, one per test module), it connects to
 * that browser instead of starting one: closing it then closes only this script's pages and contexts. */
export async function launchChromium(extraArgs = [], { autoplay = true } = {}) {
  const shared = process.env.LIPSTREAM_CHROMIUM_WS;
  if (shared && extraArgs.length === 0 && autoplay) return chromium.connect(shared);
  return chromium.launch({
    executablePath: process.env.CHROMIUM || '/usr/lib/chromium/chromium',
    headless: true,
    args: chromiumArgs(extraArgs, { autoplay }),
  });
}

/** Print the script's result (with the page problems seen) as its one JSON line. */
export function printResult(result, problems) {
  result.problems = problems;
  console.log(JSON.stringify(result));
}

/** Print a failed run as the JSON line, and make the process exit non-zero. */
export function printFailure(err, problems, extra = {}) {
  console.log(JSON.stringify({ failed: String((err && err.stack) || err), problems, ...extra }));
  process.exitCode = 1;
}

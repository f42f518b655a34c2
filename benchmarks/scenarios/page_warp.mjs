// Node: time the page's viseme warp (renderPatch of a warp.js given by path) on one packed crop.
// argv[2]: path of warp.js; argv[3]: JSON file {crop, size, geometry, rows, cfg, passes}. Prints ms per patch and
// a sha256 of every row's patch (two warp.js that draw the same patches print the same digest).
import { createHash } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

const { renderPatch, unpackGeometry } = await import(pathToFileURL(process.argv[2]).href);
const opts = JSON.parse(readFileSync(process.argv[3], 'utf8'));
const bytes = readFileSync(opts.crop);
const base32 = new Uint32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
const geo = unpackGeometry(opts.geometry);
const patch = new Uint32Array(opts.size * opts.size);
const pass = () => { for (const row of opts.rows) renderPatch(base32, opts.size, geo, row, opts.cfg, patch); };
for (let k = 0; k < 20; k++) pass(); // JIT warm-up
const started = performance.now();
for (let k = 0; k < opts.passes; k++) pass();
const msPerPatch = (performance.now() - started) / (opts.passes * opts.rows.length);
const digest = createHash('sha256');
for (const row of opts.rows) {
  renderPatch(base32, opts.size, geo, row, opts.cfg, patch);
  digest.update(new Uint8Array(patch.buffer));
}
console.log(JSON.stringify({ ms_per_patch: msPerPatch, digest: digest.digest('hex') }));

// Node (no browser): run the page's viseme warp (lipstream/web/edge/viseme/warp.js) on one packed crop for
// the given feature rows and write the patches, so a test can compare them with the Python render_patch.
// argv[2]: JSON {crop: path of size² RGBA bytes (mask in alpha), size, geometry: [...], rows: [[...]], cfg, out}
import { readFileSync, writeFileSync } from 'node:fs';
import { renderPatch, unpackGeometry } from '../../lipstream/web/edge/viseme/warp.js';

const opts = JSON.parse(process.argv[2]);
const bytes = readFileSync(opts.crop);
const base32 = new Uint32Array(bytes.buffer, bytes.byteOffset, bytes.byteLength / 4);
const geo = unpackGeometry(opts.geometry);
const out = new Uint8Array(opts.rows.length * opts.size * opts.size * 4);
opts.rows.forEach((row, k) => {
  const patch = new Uint32Array(opts.size * opts.size);
  renderPatch(base32, opts.size, geo, row, opts.cfg, patch);
  out.set(new Uint8Array(patch.buffer), k * patch.byteLength);
});
writeFileSync(opts.out, out);
console.log(JSON.stringify({ patches: opts.rows.length }));

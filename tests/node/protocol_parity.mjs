// Node (no browser): the page's wire protocol code (lipstream/web/static/protocol.js, and the patch prefix read
// by patch-view.js) on messages the Python side made, and the client messages it builds, for
// tests/test_protocol_js_parity.py. stdin: JSON {decode: [hex], build: [{kind, payload: {type, values} | packets: [hex],
// seq?, aux?, flags?}],
// patches: [hex], patchView: path of a folder holding copies of protocol.js, patch-view.js and edge/,
// opus: [hex audio payloads]}.
// stdout: one JSON line {decoded, built, patches, opus}.
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';
import * as protocol from '../../lipstream/web/static/protocol.js';

const hex = (bytes) => Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('hex');
const arrayBuffer = (h) => { const b = Buffer.from(h, 'hex'); return b.buffer.slice(b.byteOffset, b.byteOffset + b.byteLength); };

function decode(h) {
  let msg;
  try { msg = protocol.parseMedia(arrayBuffer(h)); } catch (err) { return { ok: false, error: String(err.message) }; }
  const out = { ok: true, kind: msg.kind, flags: msg.flags, seq: msg.seq, aux: msg.aux, pts: msg.pts, payload: hex(msg.payload) };
  // what player.js does with an audio payload: Int16Array over a copy of it
  if (msg.kind === protocol.Kind.AUDIO && msg.payload.byteLength % 2 === 0) out.audio = Array.from(new Int16Array(msg.payload.slice().buffer));
  return out;
}

function payloadOf({ type, values }) {
  if (type === 'int16') return Int16Array.from(values);
  if (type === 'int16-view') { const big = Int16Array.from([7, ...values, 7]); return big.subarray(1, 1 + values.length); }
  if (type === 'uint8') return Uint8Array.from(values);
  if (type === 'arraybuffer') return Uint8Array.from(values).buffer;
  throw new Error(`unknown payload type ${type}`);
}

function build({ kind, payload, seq, aux, flags, packets }) {
  const opts = {};
  if (seq !== undefined) opts.seq = seq;
  if (aux !== undefined) opts.aux = aux;
  if (flags !== undefined) opts.flags = flags;
  // a mic_opus message: the packets framed by packOpus, as player.js sends them
  const body = packets ? protocol.packOpus(packets.map((h) => new Uint8Array(arrayBuffer(h)))) : payloadOf(payload);
  return hex(new Uint8Array(protocol.buildMedia(kind, body, opts)));
}

async function patches(list, folder) {
  if (!list.length) return [];
  const { PatchView } = await import(pathToFileURL(`${folder}/patch-view.js`).href);
  return list.map((h) => {
    const seen = [];
    const fake = { // only what push() touches once the view is loaded
      loaded: true, stats: { restFrames: 0 }, entries: new Map(),
      compositor: { addPatch: (p) => seen.push({ to: 'compositor', sourceFrame: p.sourceFrame, pts: p.pts, flags: p.flags, blink: p.blink, au: '' }) },
      worker: { postMessage: (m) => seen.push({ to: 'decoder', sourceFrame: m.sourceFrame, key: m.key, au: hex(new Uint8Array(m.data)) }) },
    };
    PatchView.prototype.push.call(fake, protocol.parseMedia(arrayBuffer(h)));
    // a decoded patch reaches the compositor later with its entry's fields: the blink flag rides there
    for (const entry of fake.entries.values()) seen[0].blink = entry.blink;
    return seen;
  });
}

/** unpackOpus on an audio payload: the packets as hex, or the error it threw. */
function opus(h) {
  try {
    return { ok: true, packets: protocol.unpackOpus(new Uint8Array(arrayBuffer(h))).map(hex) };
  } catch (err) {
    return { ok: false, error: String(err.message) };
  }
}

const req = JSON.parse(readFileSync(0, 'utf8'));
const result = {
  decoded: (req.decode || []).map(decode),
  built: (req.build || []).map(build),
  patches: await patches(req.patches || [], req.patchView),
  opus: (req.opus || []).map(opus),
};
console.log(JSON.stringify(result));

// Wire protocol v1 (docs/protocol.md): 20-byte little-endian header before every binary message.
export const VERSION = 1;
export const HEADER_SIZE = 20;
export const Kind = Object.freeze({ VIDEO: 1, AUDIO: 2, PCM: 3, UPLOAD: 4, PATCH: 5, MIC_OPUS: 6 });
// BLINK (protocol 1.5, kinds 1 and 5): a blink decided at a phrase end starts on this frame
export const Flag = Object.freeze({ KEYFRAME: 1, SPEAKING: 2, END_OF_SPEECH: 4, BLINK: 8 });
export const SAMPLE_RATE = 16000;
export const SAMPLES_PER_FRAME = 640;

/** Parse a binary message into its header fields and a payload view. */
export function parseMedia(buffer) {
  if (buffer.byteLength < HEADER_SIZE) throw new Error(`binary message of ${buffer.byteLength} bytes has no header`);
  const view = new DataView(buffer);
  const version = view.getUint8(0);
  if (version !== VERSION) throw new Error(`protocol version ${version}, expected ${VERSION}`);
  const kind = view.getUint8(1);
  // every kind parses, as in protocol.py (the server sends 1, 2 and 5; 3, 4 and 6 go the other way)
  if (kind < Kind.VIDEO || kind > Kind.MIC_OPUS) throw new Error(`unknown binary message kind ${kind}; expected 1-6`);
  return {
    kind,
    flags: view.getUint8(2) & 15, // bits above 3 (and the reserved byte) are ignored (bit 3 since protocol 1.5)
    seq: view.getUint32(4, true),
    aux: view.getUint32(8, true),
    pts: Number(view.getBigUint64(12, true)),
    payload: new Uint8Array(buffer, HEADER_SIZE),
  };
}

/** Build a client binary message (PCM chunk, file upload, Opus packets). */
export function buildMedia(kind, payload, { seq = 0, aux = 0, flags = 0 } = {}) {
  const bytes = new Uint8Array(HEADER_SIZE + payload.byteLength);
  const view = new DataView(bytes.buffer);
  view.setUint8(0, VERSION);
  view.setUint8(1, kind);
  view.setUint8(2, flags);
  view.setUint32(4, seq, true);
  view.setUint32(8, aux, true);
  view.setBigUint64(12, 0n, true);
  bytes.set(new Uint8Array(payload.buffer ?? payload, payload.byteOffset ?? 0, payload.byteLength), HEADER_SIZE);
  return bytes.buffer;
}

/** Audio codecs a hello may ask for (protocol 1.3); 'pcm' is what a hello without `audio_codec` gets. */
export const AUDIO_CODECS = Object.freeze(['pcm', 'opus']);

/** A mic_opus message's payload (protocol 1.4): each packet behind its u16 LE length, as the server sends them. */
export function packOpus(packets) {
  const size = packets.reduce((n, p) => n + 2 + p.byteLength, 0);
  const out = new Uint8Array(size);
  const view = new DataView(out.buffer);
  let at = 0;
  for (const p of packets) {
    view.setUint16(at, p.byteLength, true);
    out.set(p, at + 2);
    at += 2 + p.byteLength;
  }
  return out;
}

/** The Opus packets of an audio message's payload (each behind its u16 LE length), as views into it. */
export function unpackOpus(payload) {
  const view = new DataView(payload.buffer, payload.byteOffset, payload.byteLength);
  const packets = [];
  let at = 0;
  while (at < payload.byteLength) {
    if (at + 2 > payload.byteLength) throw new Error(`opus payload ends inside a packet length at byte ${at} of ${payload.byteLength}`);
    const size = view.getUint16(at, true);
    const end = at + 2 + size;
    if (size === 0 || end > payload.byteLength) throw new Error(`opus packet of ${size} bytes at byte ${at} does not fit the ${payload.byteLength}-byte payload`);
    packets.push(payload.subarray(at + 2, end));
    at = end;
  }
  return packets;
}

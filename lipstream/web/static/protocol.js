// Wire protocol v1 (docs/protocol.md): 20-byte little-endian header before every binary message.
export const VERSION = 1;
export const HEADER_SIZE = 20;
export const Kind = Object.freeze({ VIDEO: 1, AUDIO: 2, PCM: 3, UPLOAD: 4, PATCH: 5 });
export const Flag = Object.freeze({ KEYFRAME: 1, SPEAKING: 2, END_OF_SPEECH: 4 });
export const SAMPLE_RATE = 16000;
export const SAMPLES_PER_FRAME = 640;

/** Parse a binary message into its header fields and a payload view. */
export function parseMedia(buffer) {
  if (buffer.byteLength < HEADER_SIZE) throw new Error(`binary message of ${buffer.byteLength} bytes has no header`);
  const view = new DataView(buffer);
  const version = view.getUint8(0);
  if (version !== VERSION) throw new Error(`protocol version ${version}, expected ${VERSION}`);
  const kind = view.getUint8(1);
  if (kind < Kind.VIDEO || kind > Kind.PATCH) throw new Error(`unknown binary message kind ${kind}; expected 1-5`);
  return {
    kind,
    flags: view.getUint8(2) & 7, // bits above 2 (and the reserved byte) are ignored, as in protocol.py
    seq: view.getUint32(4, true),
    aux: view.getUint32(8, true),
    pts: Number(view.getBigUint64(12, true)),
    payload: new Uint8Array(buffer, HEADER_SIZE),
  };
}

/** Build a client binary message (PCM chunk or file upload). */
export function buildMedia(kind, payload, { seq = 0, aux = 0 } = {}) {
  const bytes = new Uint8Array(HEADER_SIZE + payload.byteLength);
  const view = new DataView(bytes.buffer);
  view.setUint8(0, VERSION);
  view.setUint8(1, kind);
  view.setUint32(4, seq, true);
  view.setUint32(8, aux, true);
  view.setBigUint64(12, 0n, true);
  bytes.set(new Uint8Array(payload.buffer ?? payload, payload.byteOffset ?? 0, payload.byteLength), HEADER_SIZE);
  return bytes.buffer;
}

// Patch stream mode (protocol 1.2): decodes the mouth-rectangle H.264 stream off the main thread with WebCodecs
// and hands back crop-space RGBA (crop_size², the rectangle placed at its offset) with the source frame's mouth
// mask in alpha — the patch format of the shared compositor (lipstream/web/edge/compositor.js).
import { decodePackImage } from './edge/files.js';
import { KeyFrameDecoder } from './h264-decoder.js';

let decoder = null;
let config = null; // {codec, rect: [x0, y0, x1, y1], cropSize, masks: Uint8Array, offsets, file}
let canvas = null;
let ctx = null;
const sources = new Map(); // timestamp -> source frame of the patch being decoded
const maskCache = new Map(); // source frame -> Promise<Uint8Array> (crop-space alpha)
const outputs = []; // decoded frames in order; converted one at a time (the mask decode is async)
let converting = false;

function mask(sourceFrame) {
  if (!maskCache.has(sourceFrame)) {
    const { masks, offsets, cropSize, file } = config;
    maskCache.set(sourceFrame, decodePackImage(masks, offsets, sourceFrame, 'image/png', cropSize, file).then((rgba) => {
      const alpha = new Uint8Array(cropSize * cropSize);
      for (let p = 0; p < alpha.length; p++) alpha[p] = rgba[p * 4];
      return alpha;
    }));
  }
  return maskCache.get(sourceFrame);
}

async function convert(frame) {
  const [x0, y0, x1, y1] = config.rect;
  const w = x1 - x0;
  const h = y1 - y0;
  const size = config.cropSize;
  const sourceFrame = sources.get(frame.timestamp);
  sources.delete(frame.timestamp);
  ctx.drawImage(frame, 0, 0, w, h);
  frame.close();
  const pixels = ctx.getImageData(0, 0, w, h).data;
  const alpha = await mask(sourceFrame);
  const rgba = new Uint8ClampedArray(size * size * 4); // alpha 0 outside the rectangle: the base shows
  for (let y = 0; y < h; y++) {
    const src = y * w * 4;
    const dst = ((y0 + y) * size + x0) * 4;
    rgba.set(pixels.subarray(src, src + w * 4), dst);
    const arow = (y0 + y) * size + x0;
    for (let x = 0; x < w; x++) rgba[dst + x * 4 + 3] = alpha[arow + x];
  }
  return { rgba, sourceFrame };
}

async function drain() {
  if (converting) return;
  converting = true;
  while (outputs.length) {
    const frame = outputs.shift();
    const timestamp = frame.timestamp;
    try {
      const { rgba, sourceFrame } = await convert(frame);
      self.postMessage({ type: 'patch', timestamp, sourceFrame, rgba }, [rgba.buffer]);
    } catch (err) {
      self.postMessage({ type: 'error', message: `patch ${timestamp}: ${err.message || err}` });
    }
  }
  converting = false;
}

self.onmessage = (event) => {
  const msg = event.data;
  if (msg.type === 'configure') {
    config = { ...msg, masks: new Uint8Array(msg.masks) };
    const [x0, y0, x1, y1] = config.rect;
    canvas = new OffscreenCanvas(x1 - x0, y1 - y0);
    ctx = canvas.getContext('2d', { willReadFrequently: true });
    decoder = new KeyFrameDecoder(
      config.codec,
      (frame) => { outputs.push(frame); drain(); },
      (message) => self.postMessage({ type: 'error', message, decoder: true }),
    );
  } else if (msg.type === 'chunk') {
    if (!decoder) return;
    sources.set(msg.timestamp, msg.sourceFrame); // before decode: its output may come at once
    const done = decoder.decode(msg);
    if (done !== 'decoded') sources.delete(msg.timestamp);
    if (done === 'skipped') self.postMessage({ type: 'skipped', timestamp: msg.timestamp });
  } else if (msg.type === 'close') {
    if (decoder) decoder.close();
    decoder = null;
    for (const f of outputs) f.close();
    outputs.length = 0;
  }
};

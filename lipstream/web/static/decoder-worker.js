// WebCodecs H.264 decode of whole frames off the main thread.
import { KeyFrameDecoder } from './h264-decoder.js';

let decoder = null;

self.onmessage = (event) => {
  const msg = event.data;
  if (msg.type === 'configure') {
    decoder = new KeyFrameDecoder(
      msg.codec,
      (frame) => self.postMessage({ type: 'frame', frame, timestamp: frame.timestamp }, [frame]),
      (message) => self.postMessage({ type: 'error', message }),
    );
  } else if (msg.type === 'chunk') {
    if (decoder && decoder.decode(msg) === 'skipped') self.postMessage({ type: 'skipped', timestamp: msg.timestamp });
  } else if (msg.type === 'close') {
    if (decoder) decoder.close();
    decoder = null;
  }
};

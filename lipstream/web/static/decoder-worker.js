// WebCodecs H.264 decode off the main thread. Annex-B chunks, no description (SPS/PPS ride on every IDR).
let decoder = null;
let codec = null;
let waitingForKey = true;

function makeDecoder() {
  decoder = new VideoDecoder({
    output: (frame) => self.postMessage({ type: 'frame', frame, timestamp: frame.timestamp }, [frame]),
    error: (err) => {
      // A broken decoder is rebuilt and waits for the next IDR; the page asks the server for one.
      self.postMessage({ type: 'error', message: String(err && err.message ? err.message : err) });
      waitingForKey = true;
      makeDecoder();
    },
  });
  decoder.configure({ codec, optimizeForLatency: true, hardwareAcceleration: 'no-preference' });
}

self.onmessage = (event) => {
  const msg = event.data;
  if (msg.type === 'configure') {
    codec = msg.codec;
    waitingForKey = true;
    makeDecoder();
  } else if (msg.type === 'chunk') {
    if (!decoder || decoder.state !== 'configured') return;
    if (waitingForKey && !msg.key) {
      self.postMessage({ type: 'skipped', timestamp: msg.timestamp });
      return;
    }
    waitingForKey = false;
    decoder.decode(new EncodedVideoChunk({ type: msg.key ? 'key' : 'delta', timestamp: msg.timestamp, data: msg.data }));
  } else if (msg.type === 'close') {
    if (decoder && decoder.state !== 'closed') decoder.close();
    decoder = null;
  }
};

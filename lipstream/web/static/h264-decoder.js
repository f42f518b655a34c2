// The two players' Workers (whole frames, patch stream) share this: a WebCodecs H.264 decoder for Annex-B
// chunks without description (SPS/PPS ride on every IDR) that waits for a key frame after it is made, and
// rebuilds itself after an error, waiting again (the page then asks the server for an IDR).
export class KeyFrameDecoder {
  /** `onFrame(frame)`: each decoded VideoFrame; `onError(message)`: the decoder broke (it is rebuilt). */
  constructor(codec, onFrame, onError) {
    this.codec = codec;
    this.onFrame = onFrame;
    this.onError = onError;
    this._make();
  }

  _make() {
    this.waitingForKey = true;
    this.decoder = new VideoDecoder({
      output: this.onFrame,
      error: (err) => {
        this.onError(String(err && err.message ? err.message : err));
        this._make();
      },
    });
    this.decoder.configure({ codec: this.codec, optimizeForLatency: true, hardwareAcceleration: 'no-preference' });
  }

  /** Decode a `chunk` message: 'decoded', 'skipped' (a delta while waiting for a key frame) or 'closed'. */
  decode(msg) {
    if (this.decoder.state !== 'configured') return 'closed';
    if (this.waitingForKey && !msg.key) return 'skipped';
    this.waitingForKey = false;
    this.decoder.decode(new EncodedVideoChunk({ type: msg.key ? 'key' : 'delta', timestamp: msg.timestamp, data: msg.data }));
    return 'decoded';
  }

  close() {
    if (this.decoder.state !== 'closed') this.decoder.close();
  }
}

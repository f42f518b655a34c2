// The microphone as a stream of 20 ms Int16 chunks at the capture context's own rate (protocol `pcm`, aux = rate).
import { SAMPLE_RATE } from './protocol.js';

const WORKLET_URL = new URL('./mic-worklet.js', import.meta.url);
const LOG_SECONDS = 30;
const withWorklet = new WeakSet(); // contexts that already loaded the worklet module

/** A human sentence for a getUserMedia failure: refused, absent, busy or unavailable on this page. */
export function micErrorMessage(err) {
  const name = err && err.name;
  if (name === 'NotAllowedError' || name === 'SecurityError') {
    return 'Microphone access was refused. Allow it for this page in the browser (address bar, site settings) and press Talk again.';
  }
  if (name === 'NotFoundError' || name === 'OverconstrainedError') return 'No microphone found. Plug one in and press Talk again.';
  if (name === 'NotReadableError' || name === 'AbortError') return 'The microphone is busy or failed to start (another application may hold it).';
  if (name === 'InsecureContext') return err.message;
  return `Microphone unavailable: ${err && err.message ? err.message : err}`;
}

export class Microphone {
  /**
   * @param {AudioContext} ac the context the mic is tapped in (its rate is the rate sent)
   * @param {(pcm: Int16Array, rate: number) => void} onChunk called with each 20 ms chunk
   */
  constructor(ac, onChunk) {
    this.ac = ac;
    this.onChunk = onChunk;
    this.stream = null;
    this.node = null;
    this.sent16k = 0; // 16 kHz samples sent so far: the server's `mic_samples` clock
    this.log = []; // recent chunks {end16k, at, peak}: maps a `mic_samples` back to wall time
  }

  get rate() { return this.ac.sampleRate; }

  /** Ask for the microphone and start sending; throws with a `name` like getUserMedia's on failure. */
  async start(constraints = { channelCount: 1, echoCancellation: true, noiseSuppression: true, autoGainControl: true }) {
    if (!navigator.mediaDevices || !navigator.mediaDevices.getUserMedia) {
      const err = new Error('The microphone needs a secure page: open it over https or on localhost.');
      err.name = 'InsecureContext';
      throw err;
    }
    const stream = await navigator.mediaDevices.getUserMedia({ audio: constraints });
    try {
      if (!withWorklet.has(this.ac)) {
        await this.ac.audioWorklet.addModule(WORKLET_URL);
        withWorklet.add(this.ac);
      }
      const node = new AudioWorkletNode(this.ac, 'mic-tap');
      node.port.onmessage = (e) => this._onBlock(e.data);
      // Not connected to the speakers: the user must not hear themselves (and it would echo).
      this.ac.createMediaStreamSource(stream).connect(node);
      this.stream = stream;
      this.node = node;
    } catch (err) {
      stream.getTracks().forEach((t) => t.stop());
      throw err;
    }
  }

  _onBlock(f) {
    const pcm = new Int16Array(f.length);
    let peak = 0;
    for (let i = 0; i < f.length; i += 1) {
      const v = Math.max(-1, Math.min(1, f[i]));
      pcm[i] = Math.round(v * 32767);
      peak = Math.max(peak, Math.abs(v));
    }
    this.sent16k += (f.length * SAMPLE_RATE) / this.rate;
    const at = performance.now();
    this.log.push({ end16k: this.sent16k, at, peak });
    while (this.log.length > LOG_SECONDS * 50) this.log.shift();
    this.onChunk(pcm, this.rate);
  }

  /** Wall time (performance.now) at which mic sample `samples16k` was captured, or null when too old. */
  wallTimeOf(samples16k) {
    const hit = this.log.find((c) => c.end16k >= samples16k);
    if (!hit || (hit === this.log[0] && samples16k < hit.end16k - SAMPLE_RATE / 50)) return null;
    // A chunk arrives when its last sample is in: step back from there.
    return hit.at - ((hit.end16k - samples16k) / SAMPLE_RATE) * 1000;
  }

  get active() { return this.stream != null; }

  /** Count from zero again (the next chunk is a new session's first `pcm`). */
  restartCount() {
    this.sent16k = 0;
    this.log = [];
  }

  /** Release the device (the browser's recording indicator goes off). */
  stop() {
    if (this.stream) this.stream.getTracks().forEach((t) => t.stop());
    if (this.node) { this.node.port.onmessage = null; this.node.disconnect(); }
    this.stream = null;
    this.node = null;
  }
}

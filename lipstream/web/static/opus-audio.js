// Opus audio of a live session (protocol 1.3): each audio message's 20 ms packets through a WebCodecs AudioDecoder,
// handed back as 48 kHz samples with the 16 kHz pts of the input they start at, for the player's audio clock.
import { Flag, SAMPLE_RATE, unpackOpus } from './protocol.js';

const PACKET_SAMPLES = SAMPLE_RATE / 50; // 20 ms of input, in the 16 kHz pts units
const US_PER_SAMPLE = 1e6 / SAMPLE_RATE;

/** The AudioDecoder config for the stream `ready.audio` describes (no description: raw Opus packets). */
export function opusConfig(audio = { sample_rate: 48000, channels: 1 }) {
  return { codec: 'opus', sampleRate: audio.sample_rate, numberOfChannels: audio.channels };
}

/** Whether this browser can decode the Opus stream (WebCodecs AudioDecoder with Opus); never throws. */
export async function canDecodeOpus() {
  if (typeof AudioDecoder === 'undefined') return false;
  try {
    return (await AudioDecoder.isConfigSupported(opusConfig())).supported === true;
  } catch {
    return false;
  }
}

/**
 * Decodes one session's Opus audio. The decoded stream lags the sender's input by `pre_skip` samples at the output
 * rate: each decoded packet is handed to `onSamples({pts, samples, rate, lead, trim})`, where `pts` is the 16 kHz
 * input position the packet was cut at, `lead` the pre-skip (the samples start that much before `pts`) and `trim`
 * how many leading samples to drop (the pre-skip of a stream that restarted: the sender's encoder restarted there,
 * flagged `keyframe` on its first message, after an interrupt).
 */
export class OpusAudio {
  constructor(audio, onSamples, onError = () => {}) {
    this.config = opusConfig(audio);
    this.preSkip = audio.pre_skip;
    this.onSamples = onSamples;
    this.onError = onError;
    this._meta = []; // per packet in the decoder, in order: {pts, trim, drop}
    this._started = false;
    this._trimNext = 0;
    this.decoder = new AudioDecoder({ output: (data) => this._output(data), error: (err) => this._failed(err) });
    this.decoder.configure(this.config);
  }

  /** One audio message (parsed): its packets go to the decoder; a `keyframe` flag restarts the decoder first. */
  push(msg) {
    let packets;
    try { packets = unpackOpus(msg.payload); } catch (err) { this.onError(String(err.message)); return; }
    if ((msg.flags & Flag.KEYFRAME) || !this._started) this._restart();
    packets.forEach((packet, i) => {
      const pts = msg.pts + i * PACKET_SAMPLES;
      this._meta.push({ pts, trim: this._trimNext, drop: false });
      this._trimNext = 0;
      this.decoder.decode(new EncodedAudioChunk({ type: 'key', timestamp: Math.round(pts * US_PER_SAMPLE), data: packet }));
    });
  }

  /** The stream restarts at pts `cut`: what is still in the decoder from there on is never played. */
  cut(cut) {
    for (const m of this._meta) if (m.pts >= cut) m.drop = true;
  }

  close() {
    if (this.decoder.state !== 'closed') this.decoder.close();
    this._meta = [];
  }

  _restart() {
    if (this._started && this.decoder.state !== 'closed') {
      this.decoder.reset(); // packets of the old stream still queued are dropped with their outputs
      this.decoder.configure(this.config);
    }
    this._meta = [];
    this._started = true;
    this._trimNext = this.preSkip;
  }

  _output(data) {
    const meta = this._meta.shift();
    if (!meta || meta.drop) { data.close(); return; }
    const samples = new Float32Array(data.numberOfFrames);
    data.copyTo(samples, { planeIndex: 0, format: 'f32-planar' });
    const rate = data.sampleRate;
    data.close();
    this.onSamples({ pts: meta.pts, samples, rate, lead: this.preSkip, trim: Math.min(meta.trim, samples.length) });
  }

  _failed(err) {
    this.onError(`opus decoder: ${err.message || err}`);
    // a closed decoder cannot decode again: the next message restarts it
    this.decoder = new AudioDecoder({ output: (data) => this._output(data), error: (e) => this._failed(e) });
    this.decoder.configure(this.config);
    this._meta = [];
    this._trimNext = this.preSkip;
  }
}

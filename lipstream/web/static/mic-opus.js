// The microphone as Opus (protocol 1.4): each 20 ms Int16 chunk through a WebCodecs AudioEncoder at the capture
// rate; every 20 ms packet goes to `onPacket`. About 24 kbit/s up instead of 768 for 48 kHz PCM.
const BITRATE = 24000;

/** The AudioEncoder config for a microphone captured at `rate` Hz: mono, 20 ms packets. */
export function micOpusConfig(rate) {
  return { codec: 'opus', sampleRate: rate, numberOfChannels: 1, bitrate: BITRATE, opus: { frameDuration: 20000 } };
}

/** Whether this browser can encode the microphone as Opus at `rate` (WebCodecs AudioEncoder); never throws. */
export async function canEncodeOpus(rate) {
  if (typeof AudioEncoder === 'undefined' || typeof AudioData === 'undefined') return false;
  try {
    return (await AudioEncoder.isConfigSupported(micOpusConfig(rate))).supported === true;
  } catch {
    return false;
  }
}

/** One encoder stream: its first packet is flagged `first` (the server starts a new decoder there). */
export class OpusMicEncoder {
  /**
   * @param {number} rate the capture rate of the chunks pushed
   * @param {(packet: Uint8Array, first: boolean) => void} onPacket each encoded 20 ms packet, in order
   * @param {(message: string) => void} onError the encoder failed (the caller goes back to PCM)
   */
  constructor(rate, onPacket, onError) {
    this.rate = rate;
    this.samples = 0;
    this._first = true;
    this._failed = false;
    this.encoder = new AudioEncoder({
      output: (chunk) => {
        const packet = new Uint8Array(chunk.byteLength);
        chunk.copyTo(packet);
        onPacket(packet, this._first);
        this._first = false;
      },
      error: (err) => { this._failed = true; onError(`the microphone's Opus encoder failed: ${err.message || err}`); },
    });
    this.encoder.configure(micOpusConfig(rate));
  }

  /** One chunk of Int16 samples at `rate`. */
  push(int16) {
    if (this._failed || this.encoder.state !== 'configured') return;
    const data = new AudioData({
      format: 's16', sampleRate: this.rate, numberOfChannels: 1, numberOfFrames: int16.length,
      timestamp: Math.round((this.samples * 1e6) / this.rate), data: int16,
    });
    this.samples += int16.length;
    this.encoder.encode(data);
    data.close();
  }

  /** Stop; what is still inside the encoder (under 20 ms) is dropped. */
  close() {
    if (this.encoder.state !== 'closed') this.encoder.close();
  }
}

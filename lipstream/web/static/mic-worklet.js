// Copies microphone input out of the audio thread in 20 ms blocks of Float32.
class MicTap extends AudioWorkletProcessor {
  constructor() {
    super();
    this.block = new Float32Array(Math.round(sampleRate / 50));
    this.fill = 0;
  }

  process(inputs) {
    const input = inputs[0] && inputs[0][0];
    if (!input) return true;
    for (let i = 0; i < input.length; i += 1) {
      this.block[this.fill++] = input[i];
      if (this.fill === this.block.length) {
        this.port.postMessage(this.block.slice());
        this.fill = 0;
      }
    }
    return true;
  }
}
registerProcessor('mic-tap', MicTap);

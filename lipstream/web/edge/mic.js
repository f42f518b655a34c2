// Microphone capture through an AudioWorklet, and a streaming linear resampler to 16 kHz.

const WORKLET = `
class Capture extends AudioWorkletProcessor {
  process(inputs) {
    const ch = inputs[0] && inputs[0][0];
    if (ch) this.port.postMessage(ch.slice(0));
    return true;
  }
}
registerProcessor('lipstream-capture', Capture);
`;

/** Start capturing; onChunk(Float32Array, rate) per render quantum. Returns {stop()}. */
export async function startMicrophone(ac, onChunk) {
  const stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: true } });
  const url = URL.createObjectURL(new Blob([WORKLET], { type: 'text/javascript' }));
  await ac.audioWorklet.addModule(url);
  URL.revokeObjectURL(url);
  const source = ac.createMediaStreamSource(stream);
  const node = new AudioWorkletNode(ac, 'lipstream-capture');
  node.port.onmessage = (e) => onChunk(e.data, ac.sampleRate);
  source.connect(node);
  return {
    stop() {
      node.port.onmessage = null;
      source.disconnect();
      stream.getTracks().forEach((t) => t.stop());
    },
  };
}

/** Linear-interpolation resampler; `state` keeps the position and last sample between chunks. */
export function resampleLinear(chunk, rateIn, rateOut, state) {
  if (rateIn === rateOut) return Float32Array.from(chunk);
  const step = rateIn / rateOut;
  let pos = state.resamplePos ?? 0; // position of the next output sample, in input samples from chunk[0]
  const prev = state.resampleLast ?? 0;
  const out = [];
  while (pos < chunk.length - 1) {
    const i = Math.floor(pos);
    const t = pos - i;
    const a = i < 0 ? prev : chunk[i];
    const b = chunk[i + 1];
    out.push(a + (b - a) * t);
    pos += step;
  }
  state.resamplePos = pos - chunk.length;
  state.resampleLast = chunk[chunk.length - 1];
  return Float32Array.from(out);
}

// The in-browser Piper voice: eSpeak NG (wasm, npm `phonemizer`) -> phoneme ids -> the voice's ONNX on
// onnxruntime-web (wasm EP) -> audio at the voice's rate and at 16 kHz, one message per sentence.
import * as ort from './ort/ort.wasm.min.mjs';
import { phonemize } from './vendor/phonemizer.js';
import { splitClauses } from './clauses.js';
import { phonemesToIds, sentencesFromClauses } from './phoneme-ids.js';
import { resampleSinc } from './resample.js';

const ENGINE_RATE = 16000;
const state = { session: null, config: null, cancelled: new Set() };

/** Text -> sentences of { phonemes, ids } exactly as piper-tts builds them (clauses.js says where not). */
async function textToSentences(text) {
  const voice = state.config.espeak.voice;
  const clauses = [];
  for (const clause of splitClauses(text)) {
    const lines = await phonemize(clause.text, voice); // one clause: eSpeak returns one line (or none)
    clauses.push({ ipa: lines.join(' '), terminator: clause.terminator, endOfSentence: clause.endOfSentence });
  }
  return sentencesFromClauses(clauses, state.config.vowel_clusters).map((phonemes) => ({
    phonemes, ...phonemesToIds(phonemes, state.config.phoneme_id_map),
  }));
}

async function load({ model, config, threads }) {
  state.config = config;
  ort.env.wasm.wasmPaths = new URL('./ort/', import.meta.url).href;
  // Threads need SharedArrayBuffer, i.e. a cross-origin isolated page (COOP/COEP headers).
  ort.env.wasm.numThreads = self.crossOriginIsolated ? threads : 1;
  try {
    state.session = await ort.InferenceSession.create(new Uint8Array(model), { executionProviders: ['wasm'] });
  } catch (err) {
    throw new Error(`the voice model cannot be loaded by onnxruntime-web (${err.message}); re-export with --voice`);
  }
  await phonemize('Ready.', config.espeak.voice); // load eSpeak's data before the first request
  return { threads: ort.env.wasm.numThreads, inputs: state.session.inputNames };
}

async function synthesize(ids, scales) {
  const n = ids.length;
  const feeds = {
    input: new ort.Tensor('int64', BigInt64Array.from(ids, BigInt), [1, n]),
    input_lengths: new ort.Tensor('int64', BigInt64Array.from([BigInt(n)]), [1]),
    scales: new ort.Tensor('float32', Float32Array.from(scales), [3]),
  };
  if (state.session.inputNames.includes('sid')) feeds.sid = new ort.Tensor('int64', BigInt64Array.from([0n]), [1]);
  const result = await state.session.run(feeds);
  const audio = result[state.session.outputNames[0]].data;
  // piper-tts: each sentence normalised to a peak of 1, clipped to [-1, 1]
  let peak = 0;
  for (let i = 0; i < audio.length; i++) peak = Math.max(peak, Math.abs(audio[i]));
  const out = new Float32Array(audio.length);
  if (peak >= 1e-8) for (let i = 0; i < audio.length; i++) out[i] = Math.max(-1, Math.min(1, audio[i] / peak));
  return out;
}

async function speak({ id, text, scales }) {
  const cfg = state.config;
  const inference = cfg.inference || {};
  // [noise_scale, length_scale, noise_w]: noise off by default (as lipstream's Python voice: same text, same audio)
  const use = scales || [0, inference.length_scale ?? 1, 0];
  const sentences = await textToSentences(text);
  if (!sentences.length) throw new Error('the text has nothing eSpeak can pronounce; give some words');
  for (let i = 0; i < sentences.length; i++) {
    if (state.cancelled.has(id)) return;
    const t0 = performance.now();
    const pcm = await synthesize(sentences[i].ids, use);
    const synthMs = performance.now() - t0;
    const pcm16 = resampleSinc(pcm, cfg.audio.sample_rate, ENGINE_RATE);
    if (state.cancelled.has(id)) return;
    self.postMessage({
      type: 'sentence', id, index: i, last: i === sentences.length - 1, rate: cfg.audio.sample_rate,
      ids: sentences[i].ids, missing: sentences[i].missing, pcm, pcm16, synthMs,
    }, [pcm.buffer, pcm16.buffer]);
  }
}

self.onmessage = async (event) => {
  const msg = event.data;
  try {
    if (msg.type === 'load') self.postMessage({ type: 'loaded', id: msg.id, ...(await load(msg)) });
    else if (msg.type === 'speak') await speak(msg);
    else if (msg.type === 'phonemes') self.postMessage({ type: 'phonemes', id: msg.id, sentences: await textToSentences(msg.text) });
    else if (msg.type === 'cancel') state.cancelled.add(msg.id);
  } catch (err) {
    self.postMessage({ type: 'error', id: msg.id, message: err.message || String(err) });
  }
};

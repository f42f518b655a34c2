// Text in for the serverless page: the export's Piper voice in a Worker when the export carries one, else
// the lipstream server's POST /api/tts when one serves the page, else a message saying why there is none.
import { fetchChecked } from '../files.js';

export const MAX_TEXT_CHARS = 5000; // as lipstream's Python voices (lipstream/talk/text.py)

/** The text stripped, or an Error naming what is wrong (empty, punctuation only, too long). */
export function checkText(text, maxChars = MAX_TEXT_CHARS) {
  const stripped = (text || '').trim();
  if (!/[\p{L}\p{N}]/u.test(stripped)) throw new Error('text has nothing to speak (empty or only punctuation); type some words');
  if (stripped.length > maxChars) throw new Error(`text is ${stripped.length} characters, over the limit of ${maxChars}; shorten it`);
  return stripped;
}

/** The in-browser voice: createBrowserTts(manifest, baseUrl).ready, then speak(text, onSentence). */
export function createBrowserTts(manifest, baseUrl, { threads = 2 } = {}) {
  const voice = manifest.tts.voice;
  const worker = new Worker(new URL('./tts.worker.js', import.meta.url), { type: 'module' });
  const pending = new Map();
  let nextId = 1;
  worker.onmessage = (event) => {
    const msg = event.data;
    const job = pending.get(msg.id);
    if (!job) return;
    if (msg.type === 'error') { pending.delete(msg.id); job.reject(new Error(msg.message)); return; }
    if (msg.type === 'sentence') {
      job.onSentence(msg);
      if (msg.last) { pending.delete(msg.id); job.resolve(); }
      return;
    }
    pending.delete(msg.id);
    job.resolve(msg);
  };
  worker.onerror = (event) => {
    const err = new Error(`the TTS worker failed (${event.message || 'a module could not be loaded'}): tts/ files missing?`);
    for (const job of pending.values()) job.reject(err);
    pending.clear();
  };
  const call = (msg, onSentence = () => {}) => new Promise((resolve, reject) => {
    const id = nextId++;
    pending.set(id, { resolve, reject, onSentence });
    worker.postMessage({ ...msg, id });
    return id;
  });
  const ready = (async () => {
    const [model, configBytes] = await Promise.all([
      fetchChecked(manifest, baseUrl, voice.model), fetchChecked(manifest, baseUrl, voice.config),
    ]);
    let config;
    try { config = JSON.parse(new TextDecoder().decode(configBytes)); } catch (err) {
      throw new Error(`${voice.config}: is not valid JSON (${err.message}); re-export with --voice`);
    }
    return call({ type: 'load', model: model.buffer, config, threads });
  })();
  let current = null;
  return {
    kind: 'browser',
    ready,
    maxChars: manifest.tts.max_text_chars || MAX_TEXT_CHARS,
    /** Speak `text`: onSentence({ pcm, rate, pcm16, ids, synthMs, index, last }) per sentence, in order. */
    speak(text, onSentence) {
      const id = nextId;
      current = id;
      return call({ type: 'speak', text }, onSentence).finally(() => { if (current === id) current = null; });
    },
    /** Phoneme ids per sentence (what the tests compare with piper-tts). */
    phonemes(text) { return call({ type: 'phonemes', text }).then((msg) => msg.sentences); },
    cancel() {
      if (current === null) return;
      worker.postMessage({ type: 'cancel', id: current });
      const job = pending.get(current);
      pending.delete(current);
      if (job) job.resolve();
      current = null;
    },
  };
}

/** The page's token (?token=T) as request headers for the lipstream server's HTTP API. */
function authHeaders() {
  const token = new URL(location.href).searchParams.get('token');
  return token ? { Authorization: `Bearer ${token}` } : {};
}

/** The lipstream server's TTS when the page is served by one (GET /api/tts answers), else null. */
export async function probeServerTts() {
  let response;
  try {
    response = await fetch(new URL('/api/tts', location.origin), { headers: authHeaders(), cache: 'no-store' });
  } catch { return null; }
  if (!response.ok) return null;
  let info;
  try { info = await response.json(); } catch { return null; } // a static server's 404 page, not lipstream
  if (!info || info.endpoint !== 'tts') return null;
  return {
    kind: 'server',
    maxChars: info.max_text_chars || MAX_TEXT_CHARS,
    /** WAV bytes of `text` spoken by the server's voice (16 kHz mono 16-bit). */
    async synthesize(text) {
      const answer = await fetch(new URL('/api/tts', location.origin), {
        method: 'POST', headers: { 'Content-Type': 'application/json', ...authHeaders() },
        body: JSON.stringify({ text }),
      });
      if (!answer.ok) {
        let message = `HTTP ${answer.status}`;
        try { message = (await answer.json()).message || message; } catch { /* not JSON */ }
        throw new Error(`the server's TTS refused the text: ${message}`);
      }
      return new Uint8Array(await answer.arrayBuffer());
    },
  };
}

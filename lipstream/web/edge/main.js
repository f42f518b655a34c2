// The serverless page: base loop video, audio in (file, microphone), an in-browser engine, the compositor.
// Audio is the master clock (AudioContext); the mouth follows the base video frame on screen.
import { Compositor } from './compositor.js';
import { fetchChecked } from './files.js';
import { PhraseEndBlinks } from './lids.js';
import { resampleLinear, startMicrophone } from './mic.js';
import { checkText, createBrowserTts, probeServerTts } from './tts/tts.js';

const $ = (id) => document.getElementById(id);
const FEED_AHEAD_S = 2.0; // PCM pushed to the engine ahead of the audio clock
const CHUNK_S = 0.5;

const stats = {
  framesShown: 0, speechFramesShown: 0, late: 0, skipped: 0, mainMs: [], log: [],
  playAt: null, firstFrameAt: null, firstMouthAt: null, patches: 0, renderMs: [], featureMs: [], stages: {}, events: [],
  blinks: 0, blinkStarts: [],
};
const app = { stats, manifest: null, engine: null, compositor: null, ac: null, pcm: null, fileName: null, playing: null, errors: [] };
window.lipstreamEdge = app;

function setStatus(text) { $('status').textContent = text; }
function showError(text) {
  app.errors.push(text);
  $('error').textContent = text;
  stats.events.push({ type: 'error', message: text });
}

const baseUrl = new URL('./', location.href);

async function loadManifest() {
  let response;
  try {
    response = await fetch(new URL('export.json', baseUrl), { cache: 'no-store' });
  } catch (err) {
    throw new Error(`export.json: cannot be fetched (${err.message})`);
  }
  if (!response.ok) throw new Error(`export.json: is missing (HTTP ${response.status}); this folder is not a lipstream web export`);
  app.serverTts = response.headers.get('X-Lipstream-TTS'); // only `lipstream serve` sends it
  try {
    return await response.json();
  } catch (err) {
    throw new Error(`export.json: is not valid JSON (${err.message}); re-export the avatar`);
  }
}

async function describeGpu(engineName) {
  let adapter = null;
  try { adapter = navigator.gpu ? await navigator.gpu.requestAdapter() : null; } catch { adapter = null; }
  const neural = engineName !== 'viseme';
  if (!adapter) {
    $('gpu').textContent = neural
      ? 'No WebGPU adapter in this browser: the neural engine runs on wasm (CPU), far slower than real time.'
      : 'No WebGPU adapter in this browser (wasm fallback); the weight-free engine needs none.';
  } else {
    const f16 = adapter.features.has('shader-f16');
    $('gpu').textContent = `WebGPU adapter found${f16 ? ' with shader-f16' : ' (no shader-f16: fp32 graphs)'}.`;
  }
  app.webgpu = !!adapter;
}

async function loadVideo(manifest) {
  // Fetched whole and played from a Blob: plain static servers (python -m http.server) answer no Range
  // requests, and a video without them cannot seek, which head tracking by displayed time relies on.
  const video = $('base');
  const file = manifest.video.file;
  const bytes = await fetchChecked(manifest, baseUrl, file);
  await new Promise((resolve, reject) => {
    video.addEventListener('error', () => reject(new Error(
      `${file}: cannot be decoded by this browser (code ${video.error && video.error.code}); re-export the avatar`)), { once: true });
    video.addEventListener('loadeddata', () => resolve(), { once: true });
    video.src = URL.createObjectURL(new Blob([bytes], { type: 'video/mp4' }));
    video.play().catch(() => {}); // muted autoplay; a paused video still shows its first frame
  });
}

function withTimeout(promise, ms, what) {
  return Promise.race([promise, new Promise((_, reject) => setTimeout(() => reject(new Error(`${what} did not finish in ${ms / 1000} s`)), ms))]);
}

async function start() {
  const manifest = await loadManifest();
  app.manifest = manifest;
  $('title').textContent = `lipstream — ${manifest.name}`;
  const stage = $('stage');
  stage.style.aspectRatio = `${manifest.width} / ${manifest.height}`;
  await describeGpu(manifest.engine);
  app.compositor = new Compositor({ video: $('base'), canvas: $('mouth'), manifest, stats });
  const module = await import(`./${manifest.engine}/engine.js`);
  app.engine = module.createEngine(manifest, baseUrl, {
    onPatch: onPatch,
    onError: (err) => showError(err.message),
    onStatus: setStatus,
    onTiming: (t) => { if (t.features !== undefined) stats.featureMs.push(t.features); },
  });
  const textReady = setupText(manifest); // the voice (~60 MB) loads beside the engine, not before it
  setStatus('loading the base video and the engine…');
  await withTimeout(Promise.all([loadVideo(manifest), app.engine.ready]), 120000, 'loading');
  setStatus(`ready (${manifest.engine} engine): drop an audio file or use the microphone`);
  $('mic').disabled = false;
  $('play').disabled = !app.pcm;
  requestAnimationFrame(frameLoop);
  await textReady;
}

function onPatch(patch) {
  stats.patches += 1;
  for (const [stage, ms] of Object.entries(patch.timing || {})) {
    (stats.stages[stage] ||= []).push(ms); // per-stage engine figures for benchmarks/scenarios/serverless_page.py
    if (stage === 'render') stats.renderMs.push(ms);
  }
  const playing = app.playing;
  if (!playing) return;
  markBlink(playing, patch);
  app.compositor.addPatch(patch);
  if (!playing.started && (playing.kind === 'file' || playing.kind === 'text') && patch.frame >= 0) startPlayback(playing);
}

// ---- blinks at phrase ends -----------------------------------------------------------------------

/** Start the engine on an utterance whose frame 0 shows loop frame `loopFrameAt0`, with a fresh blink machine. */
function beginEngine(playing, loopFrameAt0) {
  const manifest = app.manifest;
  const phrase = manifest.blinks && manifest.eyes ? manifest.blinks.phrase : null;
  playing.loopFrameAt0 = loopFrameAt0;
  // null for an avatar whose idle blinks lipstream does not draw (its footage blinks by itself), as in Python
  playing.blinks = phrase ? new PhraseEndBlinks({ loopLength: manifest.loop.frames.length,
    drawnStarts: manifest.blinks.drawn_starts, fps: manifest.fps, phrase, lid: manifest.blinks.lid }) : null;
  app.engine.begin({ loopFrameAt0 });
}

/** Step the playback's blink machine on an engine patch (they come in frame order); flag the frame a blink starts. */
function markBlink(playing, patch) {
  const machine = playing.blinks;
  if (!machine || patch.frame < 0 || !patch.feature) return; // engines without feature rows get none
  // voiced as Python's atlas `speaking`: any articulation but the lip closure (silence gives closed lips only)
  // the frames easing back to the footage after the speech are silent, as the idle frames of a Python session
  const voiced = !patch.release && patch.feature.some((v, i) => i !== 2 && v !== 0);
  const position = (playing.loopFrameAt0 + patch.frame) % app.manifest.loop.frames.length;
  machine.step(patch.frame, voiced, position);
  if (machine.started === patch.frame) {
    patch.blink = true;
    stats.blinkStarts.push(patch.frame);
  }
}

// ---- audio from a file -------------------------------------------------------------------------

async function decodeFile(file) {
  const bytes = await file.arrayBuffer();
  let buffer;
  try {
    // Decoded straight to 16 kHz: a 16 kHz file's samples reach the engine unchanged.
    buffer = await new OfflineAudioContext(1, 1, 16000).decodeAudioData(bytes);
  } catch (err) {
    throw new Error(`cannot decode '${file.name}': not an audio format this browser can decode (${err.message || err.name})`);
  }
  const n = buffer.length;
  const pcm = new Float32Array(n);
  for (let c = 0; c < buffer.numberOfChannels; c++) {
    const ch = buffer.getChannelData(c);
    for (let i = 0; i < n; i++) pcm[i] += ch[i] / buffer.numberOfChannels;
  }
  if (n < 640) throw new Error(`'${file.name}' holds no audio (${n} samples)`);
  return pcm;
}

async function useFile(file) {
  $('error').textContent = '';
  try {
    app.pcm = await decodeFile(file);
    app.fileName = file.name;
    setStatus(`loaded '${file.name}' (${(app.pcm.length / 16000).toFixed(1)} s): press Play`);
    $('play').disabled = !app.engine;
    stats.events.push({ type: 'loaded', name: file.name, samples: app.pcm.length });
  } catch (err) {
    app.pcm = null;
    $('play').disabled = true;
    showError(err.message);
  }
}

function audioContext() {
  if (!app.ac) app.ac = new AudioContext({ latencyHint: 'interactive' });
  if (app.ac.state !== 'running') app.ac.resume();
  return app.ac;
}

function play() {
  if (!app.pcm || !app.engine) return;
  stop();
  const ac = audioContext();
  stats.playAt = performance.now();
  stats.firstFrameAt = null;
  stats.firstMouthAt = null;
  const playing = { kind: 'file', pcm: app.pcm, pushed: 0, started: false, t0: null, ended: false };
  app.playing = playing;
  app.compositor.begin(() => (playing.t0 === null ? -1 : Math.floor((ac.currentTime - playing.t0 - (ac.outputLatency || 0)) * 25)));
  // Which loop frame will be on screen when audio frame 0 plays: the engine renders on that frame's crop.
  beginEngine(playing, app.compositor.predictLoopIndex(0.05 + (ac.outputLatency || 0)));
  feed(playing, 1.0);
  $('stop').disabled = false;
  stats.events.push({ type: 'play', name: app.fileName });
}

/** Push PCM to the engine until it is FEED_AHEAD_S ahead of the clock (or `first` seconds at the start). */
function feed(playing, first = 0) {
  const clock = playing.t0 === null ? 0 : Math.max(app.ac.currentTime - playing.t0, 0);
  const want = Math.min(playing.pcm.length, Math.round((Math.max(clock + FEED_AHEAD_S, first)) * 16000));
  while (playing.pushed < want) {
    const next = Math.min(playing.pushed + CHUNK_S * 16000, playing.pcm.length);
    app.engine.push(playing.pcm.subarray(playing.pushed, next));
    playing.pushed = next;
  }
  if (playing.pushed >= playing.pcm.length && !playing.ended) {
    playing.ended = true;
    app.engine.end();
  }
}

function startPlayback(playing) {
  const ac = app.ac;
  if (playing.kind === 'text') {
    playing.t0 = ac.currentTime + 0.02;
    playing.started = true;
    for (const sentence of playing.sentences) scheduleSentence(playing, sentence);
    stats.events.push({ type: 'playback_started' });
    return;
  }
  const buffer = ac.createBuffer(1, playing.pcm.length, 16000);
  buffer.copyToChannel(playing.pcm, 0);
  const source = ac.createBufferSource();
  source.buffer = buffer;
  source.connect(ac.destination);
  const when = ac.currentTime + 0.02;
  source.start(when);
  playing.source = source;
  playing.t0 = when;
  playing.started = true;
  stats.events.push({ type: 'playback_started' });
}

function stop() {
  const playing = app.playing;
  if (!playing) return;
  if (playing.source) { try { playing.source.stop(); } catch { /* already stopped */ } }
  for (const sentence of playing.sentences || []) {
    if (sentence.source) { try { sentence.source.stop(); } catch { /* already stopped */ } }
  }
  if (playing.kind === 'text' && app.tts && app.tts.cancel) app.tts.cancel();
  if (playing.mic) playing.mic.stop();
  app.engine.cancel();
  app.compositor.end();
  app.playing = null;
  $('stop').disabled = true;
  stats.events.push({ type: 'playback_finished', interrupted: true });
}

function finish() {
  app.compositor.end();
  app.playing = null;
  $('stop').disabled = true;
  setStatus('finished: drop another file, or press Play again');
  stats.events.push({ type: 'playback_finished', interrupted: false });
}

// ---- audio from the microphone -------------------------------------------------------------------

async function toggleMic() {
  if (app.playing && app.playing.kind === 'mic') { app.playing.mic.stop(); app.engine.end(); return; }
  stop();
  const ac = audioContext();
  const delay = (app.engine.lookaheadFrames + 3) / 25; // features need this much audio after a frame
  const playing = { kind: 'mic', started: true, t0: null, pushed: 0 };
  try {
    playing.mic = await startMicrophone(ac, (chunk, rate) => {
      if (playing.t0 === null) playing.t0 = ac.currentTime + delay;
      const pcm = resampleLinear(chunk, rate, 16000, playing);
      playing.pushed += pcm.length;
      app.engine.push(pcm);
    });
  } catch (err) {
    showError(`microphone unavailable (${err.message || err.name})`);
    return;
  }
  app.playing = playing;
  app.compositor.begin(() => (playing.t0 === null ? -1 : Math.floor((ac.currentTime - playing.t0) * 25)));
  beginEngine(playing, app.compositor.predictLoopIndex(delay));
  $('stop').disabled = false;
  setStatus('listening: the mouth follows the microphone (press Microphone again to stop)');
}

// ---- audio from text -----------------------------------------------------------------------------
// The export's Piper voice in a Worker (sentence by sentence: speech starts after the first sentence), or
// the lipstream server's POST /api/tts when the export has no voice and a server serves the page.

function textUnavailable(reason) {
  app.textUnavailable = reason;
  $('text').disabled = true;
  $('speak').disabled = true;
  $('text').title = reason;
  $('textnote').textContent = reason;
  stats.events.push({ type: 'text_unavailable', reason });
}

async function setupText(manifest) {
  const voice = manifest.tts && manifest.tts.voice;
  if (voice) {
    $('textnote').textContent = `loading the voice '${voice.name}' (${(manifest.files[voice.model].bytes / 1e6).toFixed(0)} MB)…`;
    try {
      const tts = createBrowserTts(manifest, baseUrl, { threads: Math.min(2, navigator.hardwareConcurrency || 1) });
      const loaded = await tts.ready;
      app.tts = tts;
      stats.ttsThreads = loaded.threads;
      $('textnote').textContent = `text is spoken in this browser (Piper voice '${voice.name}', onnxruntime-web wasm, ${loaded.threads} thread${loaded.threads > 1 ? 's' : ''})`;
    } catch (err) {
      textUnavailable(`Text is unavailable: ${err.message}`);
      showError(err.message);
      return;
    }
  } else {
    // only a page served by `lipstream serve` asks it (its export.json comes with a header): probing a static host
    // would log a 404 for nothing
    const server = app.serverTts ? await probeServerTts() : null;
    if (!server) {
      textUnavailable('Text is unavailable: this export carries no voice (re-export it with `lipstream export web NAME -o DIR --voice`) and no lipstream server answers /api/tts here.');
      return;
    }
    app.tts = server;
    $('textnote').textContent = "this export carries no voice: text is spoken by the lipstream server's voice (POST /api/tts)";
  }
  $('text').placeholder = 'Type text and press Speak';
  $('text').disabled = false;
  $('speak').disabled = false;
  stats.textMode = app.tts.kind;
  stats.events.push({ type: 'text_ready', mode: app.tts.kind });
}

async function speakText() {
  if (!app.tts || !app.engine) return;
  $('error').textContent = '';
  let text;
  try {
    text = checkText($('text').value, app.tts.maxChars);
  } catch (err) {
    showError(err.message);
    return;
  }
  stats.textAt = performance.now();
  stats.firstSentenceAt = null;
  if (app.tts.kind === 'server') {
    try {
      const wav = await app.tts.synthesize(text);
      stats.firstSentenceAt = performance.now();
      await useFile(new File([wav], 'speech.wav', { type: 'audio/wav' }));
      if (app.pcm) play();
    } catch (err) {
      showError(err.message);
    }
    return;
  }
  stop();
  const ac = audioContext();
  stats.playAt = performance.now();
  stats.firstFrameAt = null;
  stats.firstMouthAt = null;
  const playing = { kind: 'text', started: false, t0: null, pushed: 0, sentences: [], ended: false };
  app.playing = playing;
  app.compositor.begin(() => (playing.t0 === null ? -1 : Math.floor((ac.currentTime - playing.t0 - (ac.outputLatency || 0)) * 25)));
  beginEngine(playing, app.compositor.predictLoopIndex(0.05 + (ac.outputLatency || 0)));
  $('stop').disabled = false;
  setStatus('speaking the text…');
  stats.events.push({ type: 'speak', chars: text.length });
  const sentenceTimes = (stats.sentences = []);
  try {
    await app.tts.speak(text, (sentence) => {
      if (app.playing !== playing) return;
      if (stats.firstSentenceAt === null) stats.firstSentenceAt = performance.now();
      sentenceTimes.push({ samples16: sentence.pcm16.length, rate: sentence.rate, samples: sentence.pcm.length, synthMs: sentence.synthMs });
      // Audio is the clock: a sentence that arrives after its slot has passed starts a little later, with
      // silence pushed to the engine for the gap so the mouth stays on the voice.
      if (playing.started) {
        const slot = playing.t0 + playing.pushed / 16000;
        const gap = Math.ceil(Math.max(0, ac.currentTime + 0.1 - slot) * 16000);
        if (gap > 0) { app.engine.push(new Float32Array(gap)); playing.pushed += gap; }
      }
      const entry = { pcm: sentence.pcm, rate: sentence.rate, at: playing.pushed, source: null };
      playing.sentences.push(entry);
      for (let i = 0; i < sentence.pcm16.length; i += CHUNK_S * 16000) {
        app.engine.push(sentence.pcm16.subarray(i, Math.min(i + CHUNK_S * 16000, sentence.pcm16.length)));
      }
      playing.pushed += sentence.pcm16.length;
      if (playing.started) scheduleSentence(playing, entry);
    });
  } catch (err) {
    if (app.playing === playing) stop();
    showError(err.message);
    return;
  }
  if (app.playing !== playing) return;
  playing.ended = true;
  app.engine.end();
}

/** Play one sentence at the voice's own rate, at its place on the utterance's 16 kHz timeline. */
function scheduleSentence(playing, sentence) {
  const ac = app.ac;
  const buffer = ac.createBuffer(1, sentence.pcm.length, sentence.rate);
  buffer.copyToChannel(sentence.pcm, 0);
  const source = ac.createBufferSource();
  source.buffer = buffer;
  source.connect(ac.destination);
  source.start(Math.max(ac.currentTime, playing.t0 + sentence.at / 16000));
  sentence.source = source;
}

// ---- the display loop ----------------------------------------------------------------------------

function frameLoop() {
  const playing = app.playing;
  if (playing) {
    if (playing.kind === 'file') feed(playing);
    const shown = app.compositor.tick();
    if (shown && shown.finished) finish();
  }
  requestAnimationFrame(frameLoop);
}

// ---- wiring --------------------------------------------------------------------------------------

$('file').addEventListener('change', (e) => { if (e.target.files[0]) useFile(e.target.files[0]); });
const drop = $('drop');
drop.addEventListener('dragover', (e) => { e.preventDefault(); drop.classList.add('over'); });
drop.addEventListener('dragleave', () => drop.classList.remove('over'));
drop.addEventListener('drop', (e) => {
  e.preventDefault();
  drop.classList.remove('over');
  if (e.dataTransfer.files[0]) useFile(e.dataTransfer.files[0]);
});
$('play').addEventListener('click', play);
$('stop').addEventListener('click', stop);
$('mic').addEventListener('click', toggleMic);
$('speak').addEventListener('click', speakText);
$('text').addEventListener('keydown', (e) => { if (e.key === 'Enter') speakText(); });

start().catch((err) => { setStatus('failed'); showError(err.message); });

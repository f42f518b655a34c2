// LivePlayer: one WebSocket session, audio scheduled on an AudioContext (the master clock), video decoded in a
// Worker and each frame drawn when its pts comes due on that clock. Protocol: docs/protocol.md.
import { FirstSpeech } from './first-speech.js';
import { OpusMicEncoder, canEncodeOpus } from './mic-opus.js';
import { OpusAudio, canDecodeOpus } from './opus-audio.js';
import { PatchView, canComposite } from './patch-view.js';
import { Flag, Kind, SAMPLE_RATE, SAMPLES_PER_FRAME, VERSION, buildMedia, packOpus, parseMedia } from './protocol.js';

const US_PER_SAMPLE = 1e6 / SAMPLE_RATE;
const MAX_OFFSET_SAMPLES = 3000;
const MAX_EVENTS = 500;
const SCHEDULE_MARGIN_S = 0.005; // a sound scheduled closer to now than this may start late
const MAX_TRIM_S = 0.03; // a sound this late loses its start; later, the clock restarts a jitter later
/** Events with a `position_samples` that fire when the audio clock gets there (captions follow the voice). */
const ON_CLOCK = new Set(['speech_started', 'playback_finished', 'reply_text']);
/** Agent events about the user or the turn: nothing to wait for, they fire on arrival. */
const ON_ARRIVAL = new Set(['state', 'user_speech_started', 'user_speech_ended', 'turn_decision', 'transcript', 'turn_metrics']);

/**
 * Close codes after which the player opens a new session by itself: the server or its replica went away
 * (1001), the connection dropped without a close frame (1006: a replica killed under a proxy), the server
 * failed (1011), restarts (1012) or was full (1013). docs/protocol.md, "Close codes".
 */
export const RECONNECT_CODES = new Set([1001, 1006, 1011, 1012, 1013]);
const RECONNECT_DELAYS_MS = [500, 1000, 2000, 4000, 8000]; // then 8 s between tries
const RECONNECT_MAX_TRIES = 20;

/** Whether a chunk of samples holds nothing to hear (the idle stream's silence; Opus leaves a trace of noise). */
function isSilent(samples) {
  for (let i = 0; i < samples.length; i += 1) if (Math.abs(samples[i]) > 1e-3) return false;
  return true;
}

/** p-th percentile of a numeric array (nearest rank). */
function percentile(values, p) {
  if (!values.length) return 0;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))];
}

export class LivePlayer extends EventTarget {
  /**
   * @param {HTMLCanvasElement} canvas where frames are drawn
   * @param {{jitterMs?: number, statsIntervalMs?: number, workerUrl?: string}} options
   */
  constructor(canvas, { jitterMs = 150, statsIntervalMs = 1000, workerUrl } = {}) {
    super();
    this.canvas = canvas;
    this.ctx2d = canvas.getContext('2d');
    this.jitter = jitterMs / 1000;
    this.statsIntervalMs = statsIntervalMs;
    this.workerUrl = workerUrl ?? new URL('./decoder-worker.js', import.meta.url);
    this.ac = null;
    this.ws = null;
    this.ready = null;
    this.firstSpeech = new FirstSpeech(); // where a speech start's time goes (benchmarks read it)
    this.resetStats();
  }

  resetStats() {
    this.stats = {
      framesReceived: 0, framesDecoded: 0, framesShown: 0, framesDropped: 0, framesLate: 0, decodeErrors: 0,
      audioChunks: 0, audioLate: 0, lateSilence: 0, audioTrimmed: 0, audioBytes: 0, bytesReceived: 0, audioSamples: 0, audioPeak: 0, micBytesSent: 0,
      speechBytes: 0, speechAudioFrames: 0, speechFramesShown: 0, ttffMs: null, ttffReceivedMs: null, firstFrameMs: null,
      interruptMs: null, lastSpeechShownAt: null, fps: 0, offsets: [], events: [], errors: [],
    };
    this._shownTimes = [];
  }

  /** Create and resume the AudioContext; call from a click handler (autoplay policy). */
  async unlockAudio() {
    if (!this.ac) this.ac = new AudioContext({ latencyHint: 'interactive' });
    if (this.ac.state !== 'running') await this.ac.resume();
    return this.ac.state;
  }

  /**
   * Open the session (`agent`: ask for a conversation, protocol 1.1); resolves with the server's `ready`.
   * When a live session ends with one of RECONNECT_CODES the player opens a new one on the same avatar by
   * itself, with backoff: events `reconnecting` {code, attempt, delayMs}, `reconnected` {ready, attempts}
   * and `reconnect_failed` {code, attempts}.
   */
  /**
   * `stream`: 'auto' (patch mode when this browser can composite, protocol 1.2), 'patch' or 'full'. In patch mode
   * the page downloads the avatar's base loop once and composites the mouth; a base loop that fails to load is
   * reported (`basefailed` {message}) and the player reopens the session with full frames.
   * `audio`: 'auto' (Opus when this browser's WebCodecs AudioDecoder decodes it, protocol 1.3), 'opus' or 'pcm'.
   * A server that sends PCM anyway (before 1.3) is played as PCM: `ready.audio_codec` decides.
   * `mic`: how `pushMic` sends the microphone: 'pcm' (default) or 'opus' (when the server takes it, protocol 1.4,
   * and this browser's AudioEncoder encodes it; PCM otherwise). Opus is 28 kbit/s up instead of 776 but measured
   * ~30-40 ms slower to barge in (docs/benchmarks.md), so it is asked for, not the default.
   */
  async connect(url, { avatar, token, outputWidth, agent = false, stream = 'auto', audio = 'auto', mic = 'pcm' } = {}) {
    this._micWanted = mic;
    this.cancelReconnect();
    await this.unlockAudio(); // first, while the click that started this still counts (autoplay policy)
    const mode = stream === 'auto' ? (canComposite() ? 'patch' : 'full') : stream;
    const audioCodec = audio === 'auto' ? ((await canDecodeOpus()) ? 'opus' : 'pcm') : audio;
    const target = { url, options: { avatar, token, outputWidth, agent, stream: mode, audioCodec } };
    this._target = target;
    try {
      return await this._open(url, target.options);
    } catch (err) {
      // 'auto' asked for the patch stream and this server offers whole frames only: take those
      if (err.code !== 'stream' || stream !== 'auto' || mode === 'full' || this._target !== target) throw err;
      target.options = { ...target.options, stream: 'full' };
      return this._open(url, target.options);
    }
  }

  async _open(url, { avatar, token, outputWidth, agent, stream = 'full', audioCodec = 'pcm' }) {
    await this.unlockAudio();
    this._teardown();
    this.resetStats();
    this._connectAt = performance.now();
    this._anchor = null; // {pts, time}: audio pts `pts` plays at AudioContext time `time`
    this._audioEnd = 0; // pts just after the last audio scheduled: nothing beyond it can be heard yet
    this._sources = new Set();
    this._frames = []; // decoded, waiting: {frame, pts, aux, flags}
    this._meta = []; // per AU sent to the decoder, in decode order (no B-frames): {pts, aux, flags, drop}
    this._pendingEvents = [];
    this._current = null;
    this.worker = new Worker(this.workerUrl, { type: 'module' });
    this.worker.onmessage = (e) => this._onWorker(e.data);
    this.ws = new WebSocket(url);
    this.ws.binaryType = 'arraybuffer';
    const opened = new Promise((resolve, reject) => {
      // `agent` only when asked: a plain hello stays byte-for-byte what v1 clients send.
      this.ws.onopen = () => this._send({ type: 'hello', version: VERSION, avatar, token, output_width: outputWidth, ...(agent ? { agent: true } : {}), ...(stream !== 'full' ? { stream } : {}), ...(audioCodec !== 'pcm' ? { audio_codec: audioCodec } : {}) });
      this.ws.onerror = () => reject(new Error(`cannot connect to ${url}`));
      this.ws.onclose = (e) => {
        reject(new Error(`session closed (${e.code}) ${e.reason || ''}`.trim()));
        const wasLive = this.ready != null;
        const reconnect = wasLive && RECONNECT_CODES.has(e.code);
        this.dispatchEvent(new CustomEvent('closed', { detail: { code: e.code, reconnecting: reconnect } }));
        if (reconnect) this._scheduleReconnect(e.code, 0);
      };
      this.ws.onmessage = (e) => {
        this.stats.bytesReceived += typeof e.data === 'string' ? e.data.length : e.data.byteLength;
        if (typeof e.data !== 'string') return this._onBinary(e.data);
        const msg = JSON.parse(e.data);
        if (msg.type === 'ready') {
          this.ready = msg;
          this._chooseMicCodec(msg);
          this.canvas.width = msg.width;
          this.canvas.height = msg.height;
          if (msg.audio_codec === 'opus') {
            this._opus = new OpusAudio(msg.audio, (chunk) => this._play(chunk), (message) => {
              this.stats.errors.push(message);
              this.stats.decodeErrors += 1;
            });
          }
          if (msg.stream === 'patch') {
            this.worker.terminate(); // whole frames never come: the patch view has its own decoder
            this.worker = null;
            this._startPatchView(msg, url, token);
          } else this.worker.postMessage({ type: 'configure', codec: msg.codec });
          resolve(msg);
        } else if (msg.type === 'error' && msg.fatal && !this.ready) {
          reject(Object.assign(new Error(msg.message), { code: msg.code }));
        }
        this._onControl(msg);
      };
    });
    this._timer = setInterval(() => this._tick(), 5);
    this._positionTimer = setInterval(() => {
      const pts = this.clockPts();
      if (pts != null && pts >= 0) this._send({ type: 'position', pts: Math.floor(pts) });
    }, 100);
    this._statsTimer = setInterval(() => this._reportStats(), this.statsIntervalMs);
    const loop = () => { this._tick(); this._raf = requestAnimationFrame(loop); };
    this._raf = requestAnimationFrame(loop);
    return opened;
  }

  /** Patch mode: load the base loop (once; the HTTP cache keeps it), then composite; on failure, fall back. */
  _startPatchView(ready, url, token) {
    const httpBase = new URL(url.replace(/^ws/, 'http'));
    const view = new PatchView(this.canvas, ready, {
      httpBase, token,
      onError: (message, decoder) => {
        this.stats.errors.push(message);
        if (decoder) { this.stats.decodeErrors += 1; this._send({ type: 'keyframe' }); }
      },
    });
    this.patchView = view;
    view.onSpeechPatch = () => this.firstSpeech.mark('decoded');
    view.load().then(() => {
      this.stats.baseLoadMs = view.stats.baseLoadMs;
      this.stats.baseBytes = view.stats.baseBytes;
      this.dispatchEvent(new CustomEvent('baseloaded', { detail: { ms: view.stats.baseLoadMs, bytes: view.stats.baseBytes } }));
    }).catch((err) => {
      if (this.patchView !== view) return; // the session was closed meanwhile
      const message = `the avatar's base loop failed to load (${err.message}); continuing with full frames`;
      this.stats.errors.push(message);
      this.stats.baseFailed = message;
      this.dispatchEvent(new CustomEvent('basefailed', { detail: { message } }));
      const target = this._target;
      if (!target) return;
      target.options = { ...target.options, stream: 'full' };
      this._open(target.url, target.options)
        .then((r) => this.dispatchEvent(new CustomEvent('fellback', { detail: { ready: r, message } })))
        .catch((e) => this.dispatchEvent(new CustomEvent('servererror', { detail: { message: e.message } })));
    });
  }

  /** Try to open a new session on the same target after `delays[attempt]` (a replica went away). */
  _scheduleReconnect(code, attempt) {
    if (attempt >= RECONNECT_MAX_TRIES || !this._target) {
      this.dispatchEvent(new CustomEvent('reconnect_failed', { detail: { code, attempts: attempt } }));
      return;
    }
    const delayMs = RECONNECT_DELAYS_MS[Math.min(attempt, RECONNECT_DELAYS_MS.length - 1)];
    this.dispatchEvent(new CustomEvent('reconnecting', { detail: { code, attempt: attempt + 1, delayMs } }));
    const target = this._target;
    this._reconnectTimer = setTimeout(async () => {
      this._reconnectTimer = null;
      try {
        if (this._target !== target) return; // closed, or connected elsewhere, meanwhile
        const ready = await this._open(target.url, target.options);
        this.dispatchEvent(new CustomEvent('reconnected', { detail: { ready, attempts: attempt + 1 } }));
      } catch (err) {
        // a refused or failed try: `ready` never came, so onclose did not schedule; the next try is here
        if (this._target === target && !this.ready) this._scheduleReconnect(code, attempt + 1);
      }
    }, delayMs);
  }

  /** Stop trying to reconnect (the user closed the session or opened another). */
  cancelReconnect() {
    clearTimeout(this._reconnectTimer);
    this._reconnectTimer = null;
  }

  _send(obj) {
    if (this.ws && this.ws.readyState === WebSocket.OPEN) this.ws.send(typeof obj === 'string' || obj instanceof ArrayBuffer ? obj : JSON.stringify(obj));
  }

  /** A request whose speech start is timed (TTFF and the stages of firstSpeech) starts now. */
  _request() {
    this._requestAt = performance.now();
    this.firstSpeech.begin(this._requestAt);
    this._firstSpeechPts = null;
  }

  /** Ask the server to speak text. */
  speak(text) {
    this._request();
    this.stats.ttffMs = null;
    this.stats.ttffReceivedMs = null;
    this._send({ type: 'speak', text });
  }

  /** Upload a whole audio file (ArrayBuffer) to be spoken. */
  upload(bytes) {
    this._request();
    this.stats.ttffMs = null;
    this.stats.ttffReceivedMs = null;
    this._send(buildMedia(Kind.UPLOAD, new Uint8Array(bytes)));
  }

  /** Push live PCM (Int16Array at `rate` Hz); `flush()` ends the utterance. */
  pushPcm(int16, rate) {
    if (this._requestAt == null) this._request();
    this._send(buildMedia(Kind.PCM, int16, { aux: rate }));
  }

  /**
   * Send one chunk of microphone audio (Int16 at `rate`) to an agent session, as Opus packets or as PCM, whichever
   * `_chooseMicCodec` chose: the user's voice, so no request timing (TTFF) starts here.
   */
  pushMic(int16, rate) {
    if (this._micCodec === 'opus') {
      if (!this._micOpus || this._micOpus.rate !== rate) this._startMicOpus(rate);
      this._micOpus.push(int16);
      return;
    }
    this._sendMic(buildMedia(Kind.PCM, int16, { aux: rate }));
  }

  _sendMic(message) {
    this.stats.micBytesSent += message.byteLength;
    this._send(message);
  }

  /** PCM until known better: Opus once this browser is found to encode it and the server (1.4) takes it. */
  _chooseMicCodec(ready) {
    this._micCodec = 'pcm';
    if (this._micOpus) { this._micOpus.close(); this._micOpus = null; }
    if (this._micWanted !== 'opus' || !(ready.mic_codecs || []).includes('opus')) return;
    canEncodeOpus(this.ac ? this.ac.sampleRate : 48000).then((ok) => { if (ok && this.ready === ready) this._micCodec = 'opus'; });
  }

  _startMicOpus(rate) {
    if (this._micOpus) this._micOpus.close();
    const encoder = new OpusMicEncoder(rate, (packet, first) => {
      if (this._micOpus !== encoder) return; // replaced or closed: its last packets belong to no stream
      this._sendMic(buildMedia(Kind.MIC_OPUS, packOpus([packet]), { aux: rate, flags: first ? Flag.KEYFRAME : 0 }));
    }, (message) => {
      this.stats.errors.push(message);
      this._micCodec = 'pcm'; // the next chunk goes as PCM: the microphone is never lost
      if (this._micOpus === encoder) this._micOpus = null;
    });
    this._micOpus = encoder;
  }

  flush() { this._send({ type: 'flush' }); }

  /** Stop speech now; the server's playback_finished(interrupted) says from which pts to drop. */
  interrupt() {
    this._interruptAt = performance.now();
    this._lastSpeechShownAt = null;
    this._send({ type: 'interrupt' });
    setTimeout(() => {
      this.stats.interruptMs = this._lastSpeechShownAt == null ? 0 : this._lastSpeechShownAt - this._interruptAt;
      this.dispatchEvent(new CustomEvent('stats', { detail: this.snapshot() }));
    }, 1000);
  }

  /** The stream restarts at pts `cut`: drop every frame and sound buffered from there on. */
  _cutAt(cut) {
    this._frames = this._frames.filter((f) => {
      if (f.pts >= cut) { f.frame.close(); return false; }
      return true;
    });
    for (const m of this._meta) if (m.pts >= cut) m.drop = true; // still inside the decoder
    if (this.patchView) this.patchView.cut(cut);
    if (this._opus) this._opus.cut(cut);
    for (const node of this._sources) {
      if (node.pts >= cut) { try { node.stop(); } catch { /* not started */ } this._sources.delete(node); }
    }
    this._pendingEvents = this._pendingEvents.filter((e) => e.position_samples < cut);
    this._audioEnd = Math.min(this._audioEnd, cut);
  }

  /**
   * Current audio clock in samples on the session timeline (the pts now being heard), or null. It stops at the end
   * of the audio received: when the stream runs dry nothing is heard, and an event or frame that arrives late must
   * wait for its sound (re-anchored a jitter later) rather than fire against a clock that ran on in silence.
   */
  clockPts() {
    if (!this._anchor || !this.ac) return null;
    let heard = this.ac.currentTime;
    const ts = this.ac.getOutputTimestamp ? this.ac.getOutputTimestamp() : null;
    if (ts && ts.contextTime > 0 && ts.performanceTime > 0) {
      heard = ts.contextTime + (performance.now() - ts.performanceTime) / 1000; // extrapolate to now
    } else {
      heard -= this.ac.outputLatency || 0;
    }
    return Math.min(this._audioEnd, this._anchor.pts + (heard - this._anchor.time) * SAMPLE_RATE);
  }

  _onBinary(buffer) {
    let msg;
    try { msg = parseMedia(buffer); } catch (err) { this.stats.errors.push(String(err)); return; }
    if (msg.flags & Flag.SPEAKING) { // what speech costs on the wire, whatever the idle/speech mix of a session
      this.stats.speechBytes += buffer.byteLength;
      if (msg.kind === Kind.AUDIO) this.stats.speechAudioFrames += 1;
      this.firstSpeech.mark(msg.kind === Kind.AUDIO ? 'audioReceived' : 'received');
      if (msg.kind === Kind.AUDIO && this._firstSpeechPts == null) this._firstSpeechPts = msg.pts;
    }
    if (msg.kind === Kind.VIDEO) {
      this.stats.framesReceived += 1;
      this.stats.videoBytes = (this.stats.videoBytes || 0) + msg.payload.byteLength;
      const speaking = (msg.flags & Flag.SPEAKING) !== 0;
      if (speaking && this.stats.ttffReceivedMs == null && this._requestAt != null) {
        this.stats.ttffReceivedMs = performance.now() - this._requestAt;
      }
      if (!this.worker) return; // a patch-mode session has no whole-frame decoder
      const timestamp = msg.pts * US_PER_SAMPLE;
      this._meta.push({ pts: msg.pts, aux: msg.aux, flags: msg.flags, drop: false });
      // Every AU is decoded (later ones depend on it); dropping happens at presentation.
      const data = msg.payload.slice().buffer;
      this.worker.postMessage({ type: 'chunk', data, timestamp, key: (msg.flags & Flag.KEYFRAME) !== 0 }, [data]);
    } else if (msg.kind === Kind.PATCH) {
      this.stats.framesReceived += 1;
      this.stats.patchBytes = (this.stats.patchBytes || 0) + msg.payload.byteLength;
      if ((msg.flags & Flag.SPEAKING) && this.stats.ttffReceivedMs == null && this._requestAt != null) {
        this.stats.ttffReceivedMs = performance.now() - this._requestAt;
      }
      if (this.patchView) this.patchView.push(msg);
    } else if (msg.kind === Kind.AUDIO) {
      this.stats.audioChunks += 1;
      this.stats.audioBytes += msg.payload.byteLength;
      if (this._opus) return this._opus.push(msg); // decoded packets come back to _play
      const pcm = new Int16Array(msg.payload.slice().buffer);
      const samples = new Float32Array(pcm.length);
      for (let i = 0; i < pcm.length; i += 1) samples[i] = pcm[i] / 32768;
      this._play({ pts: msg.pts, samples, rate: SAMPLE_RATE, lead: 0, trim: 0 });
    }
  }

  /**
   * Schedule audio on the clock: `samples` at `rate` Hz whose sample `lead` is input position `pts` (16 kHz; an Opus
   * decoder's output lags its input by its pre-skip, PCM has none), the first `trim` samples left out.
   */
  _play({ pts, samples, rate, lead, trim }) {
    const ac = this.ac;
    const now = ac.currentTime;
    const shift = (trim - lead) / rate; // where the first played sample sits relative to pts
    let at = this._anchor ? this._anchor.time + (pts - this._anchor.pts) / SAMPLE_RATE : null;
    const late = at == null ? 0 : now + SCHEDULE_MARGIN_S - (at + shift); // seconds past its time, if > 0
    let skip = 0; // seconds of the chunk's start left out
    // late silence (the idle stream's, sent just ahead of the clock under load): nothing to hear, so the
    // clock runs on through it rather than restart a jitter later
    const lateSilence = at != null && late > 0 && isSilent(samples);
    if (lateSilence) {
      this.stats.lateSilence += 1;
    } else if (at != null && late > 0 && late <= MAX_TRIM_S && late < (samples.length - trim) / rate) {
      // a few milliseconds late: its start is left out and the rest plays on time, in sync with the frames
      // (a restart would hold speech back a whole jitter buffer)
      this.stats.audioTrimmed += 1;
      skip = late;
    } else if (at == null || late > 0) {
      // First chunk, or the stream ran dry: (re)start with a small jitter buffer.
      if (at != null) this.stats.audioLate += 1;
      at = now + this.jitter;
      this._anchor = { pts, time: at };
      if (pts === this._firstSpeechPts) this.firstSpeech.marks.reanchored = true;
    }
    if (pts === this._firstSpeechPts) this._markDue(at + shift);
    this._audioEnd = Math.max(this._audioEnd, pts + ((samples.length - lead) / rate) * SAMPLE_RATE);
    if (lateSilence) return;
    this.stats.audioSamples += ((samples.length - trim) / rate) * SAMPLE_RATE; // in 16 kHz samples, as pts
    for (let i = 0; i < samples.length; i += 1) if (Math.abs(samples[i]) > this.stats.audioPeak) this.stats.audioPeak = Math.abs(samples[i]);
    const buf = ac.createBuffer(1, samples.length, rate);
    buf.copyToChannel(samples, 0);
    const node = ac.createBufferSource();
    node.buffer = buf;
    node.pts = pts;
    node.connect(ac.destination);
    node.onended = () => this._sources.delete(node);
    this._sources.add(node);
    node.start(at + shift + skip, trim / rate + skip);
  }

  /** The first speech audio was scheduled to be heard at AudioContext time `at`: when that is on performance.now(). */
  _markDue(at) {
    const ts = this.ac.getOutputTimestamp ? this.ac.getOutputTimestamp() : null;
    const due = ts && ts.contextTime > 0 && ts.performanceTime > 0
      ? ts.performanceTime + (at - ts.contextTime) * 1000
      : performance.now() + (at - this.ac.currentTime + (this.ac.outputLatency || 0)) * 1000;
    this.firstSpeech.mark('scheduled');
    this.firstSpeech.mark('due', due);
  }

  _onWorker(msg) {
    if (msg.type === 'frame') {
      const meta = this._meta.shift();
      this.stats.framesDecoded += 1;
      if (!meta || meta.drop) { msg.frame.close(); return; }
      if (meta.flags & Flag.SPEAKING) this.firstSpeech.mark('decoded');
      this._frames.push({ frame: msg.frame, pts: meta.pts, aux: meta.aux, flags: meta.flags });
    } else if (msg.type === 'error') {
      this.stats.decodeErrors += 1;
      this._meta = []; // the rebuilt decoder starts afresh at the next IDR
      this.stats.errors.push(msg.message);
      this._send({ type: 'keyframe' });
    } else if (msg.type === 'skipped') {
      this._meta.shift();
    }
  }

  _onControl(msg) {
    if (ON_CLOCK.has(msg.type)) {
      if (msg.type === 'playback_finished' && msg.interrupted) {
        this._cutAt(msg.position_samples);
        this._fire(msg);
      } else this._schedule(msg);
    } else if (ON_ARRIVAL.has(msg.type)) {
      this._fire(msg);
    } else if (msg.type === 'error') {
      this.stats.errors.push(`${msg.code}: ${msg.message}`);
      this.dispatchEvent(new CustomEvent('servererror', { detail: msg }));
    }
  }

  /** Queue an event for its position on the audio clock, after any queued at or before it (arrival order). */
  _schedule(msg) {
    const q = this._pendingEvents;
    let i = q.length;
    while (i > 0 && q[i - 1].position_samples > msg.position_samples) i -= 1;
    q.splice(i, 0, msg);
  }

  _fire(msg) {
    this.stats.events.push({ ...msg, clock: this.clockPts(), at: performance.now() });
    if (this.stats.events.length > MAX_EVENTS) this.stats.events.splice(0, this.stats.events.length - MAX_EVENTS);
    this.dispatchEvent(new CustomEvent(msg.type, { detail: msg }));
  }

  /** Presentation: show the newest due frame, hold when none is due, skip (drop) older due frames. */
  _tick() {
    const clock = this.clockPts();
    if (clock == null) return;
    while (this._pendingEvents.length && this._pendingEvents[0].position_samples <= clock) {
      this._fire(this._pendingEvents.shift());
    }
    if (this.patchView) return this._tickPatch(clock);
    if (!this._frames.length) return;
    this._frames.sort((a, b) => a.pts - b.pts);
    let due = -1;
    for (let i = 0; i < this._frames.length && this._frames[i].pts <= clock; i += 1) due = i;
    if (due < 0) return; // the next frame is not due yet: hold the one on screen
    for (let i = 0; i < due; i += 1) { this._frames[i].frame.close(); this.stats.framesDropped += 1; }
    const item = this._frames[due];
    this._frames.splice(0, due + 1);
    const offsetMs = (clock - item.pts) / (SAMPLE_RATE / 1000);
    if (offsetMs > 40) this.stats.framesLate += 1;
    this._draw(item);
    this._recordOffset(offsetMs);
  }

  /** Patch mode: the compositor draws; the same stats as full frames (skipped audio frames count as dropped). */
  _tickPatch(clock) {
    const view = this.patchView;
    const shown = view.tick(clock);
    if (!shown) return;
    this.stats.framesDropped = view.cstats.skipped;
    if (shown.offsetMs > 40) this.stats.framesLate += 1;
    this._recordOffset(shown.offsetMs);
    this._shown(shown);
  }

  _draw(item) {
    this.ctx2d.drawImage(item.frame, 0, 0, this.canvas.width, this.canvas.height);
    item.frame.close();
    this._shown(item);
  }

  /** Bookkeeping of a frame put on screen (either mode). */
  _shown(item) {
    const now = performance.now();
    if (this.stats.firstFrameMs == null && this._connectAt != null) this.stats.firstFrameMs = now - this._connectAt;
    this._current = item;
    this.stats.framesShown += 1;
    this._shownTimes.push(now);
    while (this._shownTimes.length && this._shownTimes[0] < now - 2000) this._shownTimes.shift();
    this.stats.fps = this._shownTimes.length / 2;
    if (item.flags & Flag.SPEAKING) {
      this.stats.speechFramesShown += 1;
      this.stats.lastSpeechShownAt = now;
      if (this.stats.ttffMs == null && this._requestAt != null) this.stats.ttffMs = now - this._requestAt;
      this.firstSpeech.mark('shown', now);
      if (this._interruptAt != null) this._lastSpeechShownAt = now;
    }
    this.lastShownPts = item.pts;
  }

  /** Whether the frame on screen is a speech frame (the avatar is talking). */
  get speaking() { return this._current != null && (this._current.flags & Flag.SPEAKING) !== 0; }

  _recordOffset(ms) {
    const o = this.stats.offsets;
    o.push(ms);
    if (o.length > MAX_OFFSET_SAMPLES) o.splice(0, o.length - MAX_OFFSET_SAMPLES);
  }

  /** A/V offset summary in ms (positive: picture shown after its audio started). */
  offsetSummary() {
    const o = this.stats.offsets;
    const mean = o.length ? o.reduce((a, b) => a + b, 0) / o.length : 0;
    return { p50: percentile(o, 50), p95: percentile(o, 95), max: o.length ? Math.max(...o) : 0, mean, count: o.length };
  }

  /** Plain-object stats for display and tests. */
  snapshot() {
    const { offsets, ...rest } = this.stats;
    const view = this.patchView;
    const patch = view ? {
      compositorMs: view.stats.compositorMs.slice(-1000), patches: view.stats.patches, restFrames: view.stats.restFrames,
      baseLoadMs: view.stats.baseLoadMs, baseBytes: view.stats.baseBytes, seeks: view.stats.seeks, log: view.cstats.log.slice(-300),
    } : null;
    return { ...rest, stream: this.ready?.stream ?? null, audioCodec: this.ready ? (this.ready.audio_codec ?? 'pcm') : null, micCodec: this.ready ? this._micCodec : null, patch, firstSpeech: { ...this.firstSpeech.marks }, avOffsetMs: this.offsetSummary(), clockPts: this.clockPts(), audioState: this.ac?.state };
  }

  _reportStats() {
    const s = this.stats;
    this._send({
      type: 'client_stats', av_offset_ms: this.offsetSummary(), frames_shown: s.framesShown,
      frames_dropped: s.framesDropped, frames_late: s.framesLate, decode_errors: s.decodeErrors, ttff_ms: s.ttffMs,
    });
    this.dispatchEvent(new CustomEvent('stats', { detail: this.snapshot() }));
  }

  /** Close the session for good: no reconnect. */
  close() {
    this.cancelReconnect();
    this._target = null;
    this._teardown();
  }

  /** Close the socket, the worker and every buffered frame and sound. */
  _teardown() {
    clearInterval(this._timer);
    clearInterval(this._statsTimer);
    clearInterval(this._positionTimer);
    if (this._raf) cancelAnimationFrame(this._raf);
    if (this.ws) { this.ws.onclose = null; this.ws.close(); this.ws = null; }
    if (this.worker) { this.worker.postMessage({ type: 'close' }); this.worker.terminate(); this.worker = null; }
    if (this.patchView) { this.patchView.close(); this.patchView = null; }
    if (this._opus) { this._opus.close(); this._opus = null; }
    if (this._micOpus) { this._micOpus.close(); this._micOpus = null; }
    for (const f of this._frames ?? []) f.frame.close();
    this._frames = [];
    for (const node of this._sources ?? []) { try { node.stop(); } catch { /* not started */ } }
    this.ready = null;
  }
}

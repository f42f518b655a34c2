// Patch stream mode (protocol 1.2) on the page: the avatar's base loop plays in a <video> kept on the session
// timeline by the audio clock, and the shared compositor (lipstream/web/edge/compositor.js, the serverless page's)
// draws each decoded mouth patch into the face box of the base frame ON SCREEN (head tracking by the displayed
// frame) on the player's canvas, laid over the video.
import { Compositor } from './edge/compositor.js';
import { fetchChecked } from './edge/files.js';
import { Flag, SAMPLES_PER_FRAME, SAMPLE_RATE } from './protocol.js';

const US_PER_SAMPLE = 1e6 / SAMPLE_RATE;
const PATCH_PREFIX_BYTES = 8; // u32 loop index, u32 source frame (docs/protocol.md, kind 5)
const LOAD_TIMEOUT_MS = 60000;
const SEEK_AFTER_FRAMES = 4; // further than this off the clock: seek; closer: nudge the playback rate
const MIN_SEEK_INTERVAL_MS = 500;

/** Whether this browser can composite (WebCodecs, OffscreenCanvas, per-frame video callbacks). */
export function canComposite() {
  return typeof VideoDecoder === 'function' && typeof OffscreenCanvas === 'function'
    && typeof HTMLVideoElement !== 'undefined' && 'requestVideoFrameCallback' in HTMLVideoElement.prototype;
}

function withTimeout(promise, ms, what) {
  let timer;
  const limit = new Promise((_, reject) => { timer = setTimeout(() => reject(new Error(`${what} did not load in ${ms / 1000} s`)), ms); });
  return Promise.race([promise, limit]).finally(() => clearTimeout(timer));
}

export class PatchView {
  /**
   * @param {HTMLCanvasElement} canvas the player's canvas: it becomes the transparent overlay
   * @param {object} ready the server's `ready` (with its `patch` description)
   * @param {{httpBase: string, token?: string, workerUrl?: URL, onError?: (msg: string) => void}} options
   */
  constructor(canvas, ready, { httpBase, token, workerUrl, onError }) {
    this.canvas = canvas;
    this.ready = ready;
    this.patch = ready.patch;
    this.httpBase = httpBase;
    this.token = token;
    this.workerUrl = workerUrl ?? new URL('./patch-worker.js', import.meta.url);
    this.onError = onError ?? (() => {});
    this.compositor = null;
    this.loaded = false;
    this.holdVideo = false; // tests: leave the video where it is (a stalled decoder)
    this.frozen = false; // tests: no compositing while a picture is read back
    this.entries = new Map(); // timestamp (µs) -> {frame, pts, flags, sourceFrame, drop}
    this.cstats = { framesShown: 0, speechFramesShown: 0, late: 0, skipped: 0, mainMs: [], log: [], firstFrameAt: null, firstMouthAt: null, blinks: 0 };
    this.stats = { framesShown: 0, speechFramesShown: 0, framesLate: 0, decodeErrors: 0, patches: 0, restFrames: 0,
      baseBytes: 0, baseLoadMs: null, compositorMs: [], shownK: -1, seeks: 0 };
    this._lastSeek = 0;
    this._pending = []; // patches that arrived before the base loop was ready
  }

  /** Fetch the export manifest, the base loop and the masks (the browser's HTTP cache keeps them), start the video. */
  async load() {
    const t0 = performance.now();
    const manifestUrl = new URL(this.patch.manifest, this.httpBase);
    if (this.token) manifestUrl.searchParams.set('token', this.token); // the export's files then ride a cookie
    const baseUrl = new URL(this.patch.base_url, this.httpBase);
    const manifest = await withTimeout(this._manifest(manifestUrl), LOAD_TIMEOUT_MS, 'the base loop manifest');
    if (manifest.loop.frames.length !== this.patch.loop_frames) {
      throw new Error(`${manifest.video.file}: holds ${manifest.loop.frames.length} loop frames, the session ${this.patch.loop_frames}; re-export the avatar`);
    }
    const [video, masks] = await withTimeout(Promise.all([
      fetchChecked(manifest, baseUrl, manifest.video.file),
      fetchChecked(manifest, baseUrl, manifest.masks.file),
    ]), LOAD_TIMEOUT_MS, 'the base loop');
    this.stats.baseBytes = video.length + masks.length;
    this.manifest = manifest;
    this.video = await withTimeout(this._video(video, manifest.video.file), LOAD_TIMEOUT_MS, manifest.video.file);
    this.compositor = new Compositor({ video: this.video, canvas: this.canvas, manifest, stats: this.cstats });
    this.compositor.ctx.clearRect(0, 0, this.canvas.width, this.canvas.height);
    this.canvas.style.background = 'transparent';
    this.compositor.begin(() => this._k);
    this.worker = new Worker(this.workerUrl, { type: 'module' });
    this.worker.onmessage = (e) => this._onWorker(e.data);
    const maskBytes = masks.buffer.slice(masks.byteOffset, masks.byteOffset + masks.byteLength);
    this.worker.postMessage({ type: 'configure', codec: this.patch.codec, rect: this.patch.rect, cropSize: this.patch.crop_size,
      masks: maskBytes, offsets: manifest.masks.offsets, file: manifest.masks.file }, [maskBytes]);
    this.loaded = true;
    this.stats.baseLoadMs = performance.now() - t0;
    for (const msg of this._pending.splice(0)) this.push(msg);
  }

  async _manifest(url) {
    let response;
    try { response = await fetch(url); } catch (err) { throw new Error(`export.json: cannot be fetched (${err.message})`); }
    if (!response.ok) throw new Error(`export.json: is missing (HTTP ${response.status})`);
    try { return await response.json(); } catch (err) { throw new Error(`export.json: is not valid JSON (${err.message})`); }
  }

  _video(bytes, file) {
    // played from a Blob (seekable whatever the server does with Range requests), under the overlay canvas
    const video = document.createElement('video');
    video.muted = true;
    video.playsInline = true;
    video.loop = true;
    video.className = 'base-loop';
    Object.assign(video.style, { position: 'absolute', left: '0', top: '0', width: '100%', height: '100%', objectFit: 'fill', zIndex: '0' });
    Object.assign(this.canvas.style, { position: 'relative', zIndex: '1' });
    this.canvas.parentElement.insertBefore(video, this.canvas);
    return new Promise((resolve, reject) => {
      video.addEventListener('error', () => reject(new Error(`${file}: cannot be decoded by this browser (code ${video.error && video.error.code})`)), { once: true });
      video.addEventListener('loadeddata', () => resolve(video), { once: true });
      video.src = URL.createObjectURL(new Blob([bytes], { type: 'video/mp4' }));
    });
  }

  /** A patch message (kind 5): queue its AU for decoding, or note a mouth at rest. */
  push(msg) {
    if (!this.loaded) { this._pending.push(msg); if (this._pending.length > 250) this._pending.shift(); return; }
    const view = new DataView(msg.payload.buffer, msg.payload.byteOffset, msg.payload.byteLength);
    const sourceFrame = view.getUint32(4, true);
    const au = msg.payload.subarray(PATCH_PREFIX_BYTES);
    const frame = msg.pts / SAMPLES_PER_FRAME;
    // the server decided a blink at a phrase end starting on this frame: the compositor lowers the lids
    const blink = (msg.flags & Flag.BLINK) !== 0;
    if (!au.length) {
      this.stats.restFrames += 1;
      this.compositor.addPatch({ frame, rgba: null, sourceFrame, pts: msg.pts, flags: msg.flags, blink });
      return;
    }
    const timestamp = msg.pts * US_PER_SAMPLE;
    this.entries.set(timestamp, { frame, pts: msg.pts, flags: msg.flags, sourceFrame, drop: false, blink });
    // a decoder that failed and was rebuilt never answers for what it held: forget the oldest (insertion order)
    while (this.entries.size > 100) this.entries.delete(this.entries.keys().next().value);
    const data = au.slice().buffer;
    this.worker.postMessage({ type: 'chunk', data, timestamp, key: (msg.flags & Flag.KEYFRAME) !== 0, sourceFrame }, [data]);
  }

  _onWorker(msg) {
    if (msg.type === 'patch') {
      const entry = this.entries.get(msg.timestamp);
      this.entries.delete(msg.timestamp);
      if (!entry || entry.drop) return;
      this.stats.patches += 1;
      this.compositor.addPatch({ frame: entry.frame, rgba: msg.rgba, sourceFrame: entry.sourceFrame, pts: entry.pts, flags: entry.flags,
        blink: entry.blink });
      if ((entry.flags & Flag.SPEAKING) && this.onSpeechPatch) this.onSpeechPatch(); // the player's first-speech probe
    } else if (msg.type === 'skipped') {
      this.entries.delete(msg.timestamp);
    } else if (msg.type === 'error') {
      this.stats.decodeErrors += 1;
      this.onError(msg.message, !!msg.decoder);
    }
  }

  /** Drop everything from pts `cut` on (an interrupt). */
  cut(cut) {
    for (const entry of this.entries.values()) if (entry.pts >= cut) entry.drop = true;
    this._pending = this._pending.filter((m) => m.pts < cut);
    const u = this.compositor && this.compositor.utterance;
    if (u) for (const k of [...u.patches.keys()]) if (k * SAMPLES_PER_FRAME >= cut) u.patches.delete(k);
    if (u && u.blinks) u.blinks = u.blinks.filter((k) => k * SAMPLES_PER_FRAME < cut); // blinks of dropped frames
  }

  /** Keep the base video on the session timeline: loop index floor(clock / 640) mod loop length. */
  _syncVideo(clock) {
    const v = this.video;
    if (this.holdVideo) return;
    const n = this.manifest.loop.frames.length;
    const fps = this.manifest.fps;
    const expected = Math.floor(clock / SAMPLES_PER_FRAME) % n;
    if (v.paused) {
      v.currentTime = (expected + 1.5) / fps; // it starts a little ahead: playing takes a moment
      v.play().catch(() => {});
      this._lastSeek = performance.now();
      return;
    }
    let diff = (expected - this.compositor.displayedLoopIndex()) % n;
    if (diff > n / 2) diff -= n;
    if (diff < -n / 2) diff += n;
    const now = performance.now();
    if (Math.abs(diff) > SEEK_AFTER_FRAMES) {
      if (now - this._lastSeek > MIN_SEEK_INTERVAL_MS) {
        this._lastSeek = now;
        this.stats.seeks += 1;
        v.currentTime = ((expected + 3) % n + 0.5) / fps;
      }
      v.playbackRate = 1;
    } else {
      v.playbackRate = 1 + Math.max(-0.2, Math.min(0.2, diff * 0.05));
    }
  }

  /**
   * One display frame at audio clock `clock` (samples): sync the video, composite. Returns the frame shown when the
   * audio frame changed ({k, pts, flags, offsetMs}), else null.
   */
  tick(clock) {
    if (!this.loaded || clock == null || this.frozen) return null; // frozen: tests read the picture back
    const t0 = performance.now();
    this._syncVideo(clock);
    this._k = Math.floor(clock / SAMPLES_PER_FRAME);
    const shown = this.compositor.tick();
    if (!shown || shown.k === this.stats.shownK) return null;
    // per audio frame put on screen: video sync + patch upload + draw (ticks in between only hold the picture)
    this.stats.compositorMs.push(performance.now() - t0);
    if (this.stats.compositorMs.length > 3000) this.stats.compositorMs.shift();
    this.stats.shownK = shown.k;
    const patch = this.compositor.current;
    if (!patch) return null; // no patch or rest note for this frame yet (nothing received)
    this.stats.framesShown += 1;
    return { k: shown.k, pts: patch.pts, flags: patch.flags, offsetMs: (clock - patch.pts) / (SAMPLE_RATE / 1000) };
  }

  close() {
    if (this.worker) { this.worker.postMessage({ type: 'close' }); this.worker.terminate(); this.worker = null; }
    if (this.video) { this.video.pause(); URL.revokeObjectURL(this.video.src); this.video.remove(); this.video = null; }
    if (this.compositor) { this.compositor.end(); this.compositor = null; }
    this.canvas.style.background = '';
    this.loaded = false;
  }
}

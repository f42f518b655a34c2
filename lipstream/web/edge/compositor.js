// Main-thread compositor: at every display frame, the patch of the audio frame being heard is drawn into the
// face box of the base video frame ON SCREEN (from the video's presented-frame metadata), with its mask alpha.
// A blink decided at a phrase end (a patch with `blink: true`) lowers the lids of that same on-screen frame: the
// eyes' rectangle is read back from the video, redrawn by lids.js and put on the overlay while the blink lasts.
import { blinkCurve, closeEyes, lidRect } from './lids.js';

const BLINK_DURATION_S = 0.28; // phrase_blinks.PhraseBlinkConfig.duration_s, for an export that names none

export class Compositor {
  constructor({ video, canvas, manifest, stats }) {
    this.video = video;
    this.canvas = canvas;
    this.manifest = manifest;
    this.stats = stats;
    this.fps = manifest.fps;
    this.loop = manifest.loop.frames;
    canvas.width = manifest.width;
    canvas.height = manifest.height;
    this.ctx = canvas.getContext('2d');
    const size = manifest.crop_size;
    this.patchCanvas = new OffscreenCanvas(size, size);
    this.patchCtx = this.patchCanvas.getContext('2d');
    this.patchImage = new ImageData(size, size);
    this.presented = null; // mediaTime of the frame the compositor last presented
    this.drawn = null; // {box, patch} currently on the overlay
    this.utterance = null;
    this.setupLids(manifest);
    if ('requestVideoFrameCallback' in video) {
      const onFrame = (now, meta) => {
        this.presented = meta.mediaTime;
        video.requestVideoFrameCallback(onFrame);
      };
      video.requestVideoFrameCallback(onFrame);
      video.addEventListener('seeked', () => { this.presented = null; });
    }
  }

  /** Lids need the export's eye points (exports written before blinks at phrase ends have none: no lids). */
  setupLids(manifest) {
    const blinks = manifest.blinks;
    this.eyes = blinks && manifest.eyes ? manifest.eyes : null;
    this.lidDrawn = null; // {rect, closure, sourceFrame, start} on the overlay now
    this.lidRects = new Map(); // source frame -> its eyes' rectangle (or null)
    if (!this.eyes) return;
    this.lidConfig = blinks.lid;
    // the page's blinks and the server's flagged ones last as the export's config says (the server's default)
    const seconds = blinks.phrase ? blinks.phrase.duration_s : BLINK_DURATION_S;
    this.lidCurve = blinkCurve(seconds * this.fps, blinks.lid.close_share, blinks.lid.shut_share ?? 0);
    this.lidCanvas = new OffscreenCanvas(1, 1);
    this.lidCtx = this.lidCanvas.getContext('2d', { willReadFrequently: true });
  }

  /** Loop index (into manifest.loop.frames) of the base video frame on screen now. */
  displayedLoopIndex() {
    const v = this.video;
    const t = !v.paused && this.presented !== null ? this.presented : v.currentTime;
    return Math.floor(t * this.fps + 1e-3) % this.loop.length;
  }

  /** The loop index expected on screen `seconds` from now (the engine's hint for which crop to render on). */
  predictLoopIndex(seconds) {
    const now = this.displayedLoopIndex();
    if (this.video.paused) return now;
    return (now + Math.round(seconds * this.fps)) % this.loop.length;
  }

  /** Start showing an utterance: frameAt() gives the audio frame being heard (or < 0 before it starts). */
  begin(frameAt) {
    this.current = null;
    this.utterance = { frameAt, patches: new Map(), lastShown: -1, newest: -1, ended: false, lastFrame: Infinity, blinks: [] };
  }

  addPatch(patch) {
    const u = this.utterance;
    if (!u) return;
    if (patch.frame >= 0) {
      u.patches.set(patch.frame, patch);
      u.newest = Math.max(u.newest, patch.frame);
      // kept apart from the patches (which are dropped once shown): the blink outlasts its first frame
      if (patch.blink && !u.blinks.includes(patch.frame)) u.blinks.push(patch.frame);
    }
    if (patch.last) u.lastFrame = patch.frame;
  }

  end() {
    this.utterance = null;
    this.clear();
    this.clearLids();
  }

  clear() {
    if (this.drawn) {
      const [x1, y1, x2, y2] = this.drawn.box;
      this.ctx.clearRect(x1 - 2, y1 - 2, x2 - x1 + 4, y2 - y1 + 4);
      this.drawn = null;
      if (this.lidDrawn) this.lidDrawn.stale = true; // the face box may hold part of the lids: redraw them
    }
  }

  /** Take the lids off the overlay (the video's own eyes show again). */
  clearLids() {
    if (!this.lidDrawn) return;
    const [x0, y0, x1, y1] = this.lidDrawn.rect;
    this.ctx.clearRect(x0, y0, x1 - x0, y1 - y0);
    this.lidDrawn = null;
  }

  /** The lid closure at audio frame k: the latest phrase blink begun at or before k, if still under way. */
  lidClosure(u, k) {
    if (!this.eyes || !u.blinks.length) return { closure: 0, start: null };
    const n = this.lidCurve.length;
    // blinks that are over are forgotten (the live player's utterance lasts the whole session)
    if (u.blinks.some((s) => k - s >= n)) u.blinks = u.blinks.filter((s) => k - s < n);
    let start = null;
    for (const s of u.blinks) if (s <= k && (start === null || s > start)) start = s;
    if (start === null) return { closure: 0, start: null };
    return { closure: this.lidCurve[k - start], start };
  }

  /** Lower the lids of the video frame on screen (source frame `sourceFrame`) by `closure` on the overlay. */
  drawLids(sourceFrame, closure, start) {
    const points = this.eyes[sourceFrame];
    if (!this.lidRects.has(sourceFrame)) {
      this.lidRects.set(sourceFrame, points ? lidRect(points, this.lidConfig, this.canvas.width, this.canvas.height) : null);
    }
    const rect = this.lidRects.get(sourceFrame);
    const d = this.lidDrawn;
    if (d && !d.stale && d.closure === closure && d.sourceFrame === sourceFrame) return false;
    if (d && d.rect !== rect) this.clearLids();
    if (!rect) return false;
    const [x0, y0, x1, y1] = rect;
    const w = x1 - x0, h = y1 - y0;
    if (this.lidCanvas.width !== w || this.lidCanvas.height !== h) {
      this.lidCanvas.width = w;
      this.lidCanvas.height = h;
    }
    // the video's own pixels of the frame on screen (the lid is its skin, stretched), not the overlay's
    this.lidCtx.drawImage(this.video, x0, y0, w, h, 0, 0, w, h);
    const image = this.lidCtx.getImageData(0, 0, w, h);
    const shifted = points.map((v, i) => v - (i % 2 === 0 ? x0 : y0));
    const lowered = closeEyes(image, shifted, closure, this.lidConfig, new ImageData(w, h));
    this.ctx.putImageData(lowered, x0, y0); // replaces the rect: the mouth's mask never reaches the eyes
    this.lidDrawn = { rect, closure, sourceFrame, start };
    return true;
  }

  /** One display frame; returns the audio frame shown (or null when no utterance plays). */
  tick() {
    const u = this.utterance;
    if (!u) return null;
    const t0 = performance.now();
    const k = u.frameAt();
    if (k < 0) return null;
    const s = this.stats;
    if (k > u.lastFrame) return { k, finished: true };
    let patch = u.patches.get(k);
    if (k !== u.lastShown) {
      if (!patch) s.late += 1; // heard before its patch arrived: an older one stays up
      if (u.lastShown >= 0 && k > u.lastShown + 1) s.skipped += k - u.lastShown - 1;
      for (const old of u.patches.keys()) if (old < k) u.patches.delete(old);
      u.lastShown = k;
      s.framesShown += 1;
    }
    if (!patch) patch = this.current || null;
    this.current = patch;
    const loopIndex = this.displayedLoopIndex();
    const sourceFrame = this.loop[loopIndex];
    const box = this.manifest.boxes[sourceFrame];
    const lid = this.lidClosure(u, k);
    if (lid.closure <= 1e-3 && this.lidDrawn) {
      this.clearLids();
      this.clear(); // the face box may overlap the rect just cleared: the mouth is redrawn whole below
    }
    if (!patch || !patch.rgba) {
      this.clear();
    } else {
      if (!this.drawn || this.drawn.patch !== patch || this.drawn.box !== box) {
        if (this.drawn?.patch !== patch) {
          this.patchImage.data.set(patch.rgba);
          this.patchCtx.putImageData(this.patchImage, 0, 0);
        }
        this.clear();
        const [x1, y1, x2, y2] = box;
        this.ctx.drawImage(this.patchCanvas, x1, y1, x2 - x1, y2 - y1);
        this.drawn = { box, patch };
      }
      if (s.firstMouthAt === null) s.firstMouthAt = performance.now();
      s.speechFramesShown += 1;
    }
    if (lid.closure > 1e-3) {
      const first = !this.lidDrawn || this.lidDrawn.start !== lid.start;
      if (this.drawLids(sourceFrame, lid.closure, lid.start) && first) s.blinks = (s.blinks || 0) + 1;
    }
    if (s.firstFrameAt === null) s.firstFrameAt = performance.now();
    s.log.push({ k, loopIndex, sourceFrame, patchSource: patch ? patch.sourceFrame : null, mouth: !!(patch && patch.rgba),
      lids: this.lidDrawn ? this.lidDrawn.closure : 0 });
    if (s.log.length > 2000) s.log.shift();
    s.mainMs.push(performance.now() - t0);
    return { k, finished: false };
  }
}

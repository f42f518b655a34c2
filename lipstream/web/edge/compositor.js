// Main-thread compositor: at every display frame, the patch of the audio frame being heard is drawn into the
// face box of the base video frame ON SCREEN (from the video's presented-frame metadata), with its mask alpha.

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
    if ('requestVideoFrameCallback' in video) {
      const onFrame = (now, meta) => {
        this.presented = meta.mediaTime;
        video.requestVideoFrameCallback(onFrame);
      };
      video.requestVideoFrameCallback(onFrame);
      video.addEventListener('seeked', () => { this.presented = null; });
    }
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
    this.utterance = { frameAt, patches: new Map(), lastShown: -1, newest: -1, ended: false, lastFrame: Infinity };
  }

  addPatch(patch) {
    const u = this.utterance;
    if (!u) return;
    if (patch.frame >= 0) {
      u.patches.set(patch.frame, patch);
      u.newest = Math.max(u.newest, patch.frame);
    }
    if (patch.last) u.lastFrame = patch.frame;
  }

  end() {
    this.utterance = null;
    this.clear();
  }

  clear() {
    if (this.drawn) {
      const [x1, y1, x2, y2] = this.drawn.box;
      this.ctx.clearRect(x1 - 2, y1 - 2, x2 - x1 + 4, y2 - y1 + 4);
      this.drawn = null;
    }
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
    if (s.firstFrameAt === null) s.firstFrameAt = performance.now();
    s.log.push({ k, loopIndex, sourceFrame, patchSource: patch ? patch.sourceFrame : null, mouth: !!(patch && patch.rgba) });
    if (s.log.length > 2000) s.log.shift();
    s.mainMs.push(performance.now() - t0);
    return { k, finished: false };
  }
}

// Blinks at phrase ends on the page: the page's copy of lipstream/avatar/phrase_blinks.py (when a blink starts) and
// of blink.py's lid drawing (what a lowered lid looks like). tests/test_lids_js_parity.py keeps both in step with
// Python: the same closures frame by frame, and lids within a level or two of cv2.remap's.

const HASH_MULTIPLIER = 2654435761; // Knuth's multiplicative hash, as phrase_blinks.HASH_MULTIPLIER
const TAB = 32; // cv2.remap's INTER_TAB_SIZE: float maps are rounded to 1/32 px before bilinear weights

const f = Math.fround;

/** Python's round(): halves go to the even neighbour (round(2.5) is 2), so pause lengths agree. */
function roundHalfEven(x) {
  const r = Math.round(x);
  return (r - x === 0.5 && r % 2 !== 0) ? r - 1 : r;
}

/** Python's a % n for n > 0: never negative (a loop position behind the start wraps to the loop's end). */
function mod(a, n) {
  return ((a % n) + n) % n;
}

/**
 * blink.blink_curve: lid closure 0..1 at each frame centre of a blink `durationFrames` long, as float32: eased down
 * over `closeShare` of it, shut over `shutShare`, eased up over the rest.
 */
export function blinkCurve(durationFrames, closeShare, shutShare = 0) {
  const n = Math.max(2, Math.ceil(durationFrames - 1e-9)); // 0.28 s * 25 is 7.000000000000001 frames, not 8
  const rest = Math.max(1 - closeShare - shutShare, 1e-6);
  const curve = new Float64Array(n);
  let peak = 0;
  for (let i = 0; i < n; i++) {
    const t = (i + 0.5) / durationFrames;
    const closing = Math.min(Math.max(t / closeShare, 0), 1);
    const opening = Math.min(Math.max((1 - t) / rest, 0), 1);
    curve[i] = 0.5 - 0.5 * Math.cos(Math.PI * Math.min(closing, opening));
    peak = Math.max(peak, curve[i]);
  }
  // a blink too short for a frame centre to fall on its shut part: its nearest frame still shows it shut
  return Float32Array.from(curve, (v) => v / Math.max(peak, 1e-6));
}

/** phrase_blinks.phrase_chance: a uniform 0..1 from the frame number alone, bit for bit as Python's. */
export function phraseChance(frame) {
  // Math.imul multiplies modulo 2^32 (a float product would lose the low bits); >>> 0 reads it unsigned
  return (Math.imul(frame, HASH_MULTIPLIER) >>> 0) / 4294967296;
}

/** phrase_blinks.PhraseEndBlinks: per frame, in order, voiced or not and the loop position; returns the closure. */
export class PhraseEndBlinks {
  /**
   * @param {{loopLength: number, drawnStarts: number[], fps: number, phrase: object, lid: object}} options
   *   phrase: export.json's blinks.phrase (PhraseBlinkConfig.entry()); lid: blinks.lid (close_share and shut_share
   *   are read; an export without shut_share had no shut plateau)
   */
  constructor({ loopLength, drawnStarts, fps = 25, phrase, lid }) {
    this.loopLength = loopLength;
    this.drawnStarts = drawnStarts || [];
    this.fps = fps;
    this.config = phrase;
    this.curve = blinkCurve(phrase.duration_s * fps, lid.close_share, lid.shut_share ?? 0);
    this.voicedRun = 0;
    this.pauseRun = 0;
    this.started = null; // frame the current or last phrase blink began
    this.last = null; // the last frame stepped
  }

  /** Lid closure for frame `frame` (its number decides by hash), shown on loop `position`. */
  step(frame, voiced, position) {
    if (this.last !== null && frame !== this.last + 1) {
      this.voicedRun = this.pauseRun = 0; // a jump in the timeline: start afresh, as Python does
      if (this.started !== null && frame < this.started) this.started = null;
    }
    this.last = frame;
    if (voiced) {
      this.voicedRun += 1;
      this.pauseRun = 0;
    } else {
      this.pauseRun += 1;
      const pause = Math.max(1, roundHalfEven(this.config.pause_s * this.fps));
      if (this.pauseRun === pause) {
        const phrase = this.voicedRun >= this.config.min_phrase_s * this.fps;
        if (phrase && this.mayStart(frame, position)) this.started = frame;
        this.voicedRun = 0;
      }
    }
    if (this.started === null) return 0;
    const k = frame - this.started;
    return k >= 0 && k < this.curve.length ? this.curve[k] : 0;
  }

  mayStart(frame, position) {
    if (this.config.enabled === false || phraseChance(frame) >= this.config.chance) return false;
    const gap = this.config.gap_s * this.fps;
    if (this.started !== null && frame - this.started < gap) return false;
    for (const start of this.drawnStarts) {
      const ahead = mod(start - position, this.loopLength); // the drawn blink comes this many frames later
      const behind = mod(position - start, this.loopLength); // ... or began this many frames ago
      if (Math.min(ahead, behind) < gap) return false;
    }
    return true;
  }
}

// Eye points, as export.json's `eyes` rows carry them: 72 numbers, x then y of the 36 points of blink.EYES in
// its order (right eye upper lid 9, lower lid 9, then the left eye's), outer corner to inner corner.
const EYE_POINTS = 9;

function contour(points, eye, lower) {
  const at = (eye * 2 + (lower ? 1 : 0)) * EYE_POINTS * 2;
  const xs = [], ys = [];
  for (let i = 0; i < EYE_POINTS; i++) { xs.push(points[at + 2 * i]); ys.push(points[at + 2 * i + 1]); }
  const order = [...xs.keys()].sort((a, b) => xs[a] - xs[b]); // _row_at interpolates along x
  return { xs, ys, xp: order.map((i) => xs[i]), fp: order.map((i) => ys[i]) };
}

/** np.linalg.norm of a float32 difference, in float32 (the eye width Python's thresholds use). */
function eyeWidth(c) {
  const dx = f(c.xs[0] - c.xs[EYE_POINTS - 1]);
  const dy = f(c.ys[0] - c.ys[EYE_POINTS - 1]);
  return f(Math.sqrt(f(f(dx * dx) + f(dy * dy))));
}

/** The eyes' rectangle [x0, y0, x1, y1] (even) a lid can move, as render/eyelids.EyeLids; null: no eyes to close. */
export function lidRect(points, lid, width, height) {
  let bx0 = Infinity, by0 = Infinity, bx1 = -Infinity, by1 = -Infinity;
  for (let eye = 0; eye < 2; eye++) {
    const upper = contour(points, eye, false);
    const lower = contour(points, eye, true);
    const eyeW = eyeWidth(upper);
    if (eyeW < 4) continue;
    const reach = f(lid.lid_reach * eyeW);
    const xs = [...upper.xs, ...lower.xs], ys = [...upper.ys, ...lower.ys];
    const margin = f(0.3 * eyeW);
    // as close_eyes reaches: a quarter eye width past the corners, the lid's reach above, half of it below
    // (float32 sums, as numpy adds a Python float to a float32 landmark)
    bx0 = Math.min(bx0, f(f(Math.min(...xs)) - margin));
    by0 = Math.min(by0, f(f(f(Math.min(...ys)) - reach) - 2));
    bx1 = Math.max(bx1, f(f(Math.max(...xs)) + margin));
    by1 = Math.max(by1, f(f(f(Math.max(...ys)) + f(0.5 * lid.lid_reach * eyeW)) + 2));
  }
  if (bx0 === Infinity) return null;
  const x0 = Math.max(Math.floor(Math.floor(bx0) / 2) * 2, 0);
  const y0 = Math.max(Math.floor(Math.floor(by0) / 2) * 2, 0);
  const x1 = Math.min(Math.ceil(Math.ceil(bx1) / 2) * 2, Math.floor(width / 2) * 2);
  const y1 = Math.min(Math.ceil(Math.ceil(by1) / 2) * 2, Math.floor(height / 2) * 2);
  return x1 - x0 >= 4 && y1 - y0 >= 4 ? [x0, y0, x1, y1] : null;
}

/** blink._row_at: the contour's row at column x (np.interp over it sorted by x, flat past its ends), float32. */
function rowAt(c, x) {
  const { xp, fp } = c;
  const last = EYE_POINTS - 1;
  if (x < xp[0]) return f(fp[0]);
  if (x >= xp[last]) return f(fp[last]);
  let j = 0;
  while (j < last - 1 && xp[j + 1] <= x) j++;
  if (xp[j] === x) return f(fp[j]);
  const slope = (fp[j + 1] - fp[j]) / (xp[j + 1] - xp[j]);
  return f(slope * (x - xp[j]) + fp[j]);
}

/**
 * blink.close_eyes: `image` ({data: RGBA bytes, width, height}) with both upper lids lowered by `closure` (0 open ..
 * 1 shut), the lower lids rising to meet them; `points` the eye points (72 numbers, see above) in its pixels; `lid`
 * export.json's blinks.lid. Returns a new image (or fills `out`); pixels no lid moves are copied unchanged.
 */
export function closeEyes(image, points, closure, lid, out = null) {
  const { width, height, data } = image;
  const result = out || { width, height, data: new Uint8ClampedArray(data.length) };
  result.data.set(data);
  if (closure <= 1e-3) return result;
  for (let eye = 0; eye < 2; eye++) {
    lowerLid(result.data, data, width, height, contour(points, eye, false), contour(points, eye, true), closure, lid);
  }
  return result;
}

// _lower_lid, step for step in float32 (Math.fround after each operation, as numpy's float32 arrays compute), so the
// backward map equals Python's; the sampling is cv2.remap's INTER_LINEAR with BORDER_REPLICATE: coordinates rounded
// to 1/32 px, integer weights, rounded to nearest. Each eye reads the unlowered picture, as Python's remap of `rgb`.
function lowerLid(dst, src, width, height, upper, lower, closure, lid) {
  const eyeW = eyeWidth(upper);
  if (eyeW < 4) return;
  const reach = lid.lid_reach * eyeW;
  const allX = [...upper.xs, ...lower.xs];
  // a float32 landmark minus a Python float is float32 in numpy: the bounds round as Python's do
  const quarter = f(0.25 * eyeW);
  const x0 = Math.max(Math.floor(f(f(Math.min(...allX)) - quarter)), 0);
  const x1 = Math.min(Math.ceil(f(f(Math.max(...allX)) + quarter)) + 1, width);
  const y0 = Math.max(Math.floor(f(f(Math.min(...upper.ys)) - f(reach))) - 1, 0);
  const y1 = Math.min(Math.ceil(f(f(Math.max(...lower.ys)) + f(0.5 * reach))) + 1, height);
  if (x1 - x0 < 4 || y1 - y0 < 4) return;
  const left = f(Math.min(upper.xs[0], upper.xs[EYE_POINTS - 1]));
  const right = f(Math.max(upper.xs[0], upper.xs[EYE_POINTS - 1]));
  const fifth = f(0.2 * eyeW), meetShare = f(lid.meet), c = f(closure), reach32 = f(reach), half = f(0.5 * reach);
  const eps = f(1e-3);
  // the lash band above the edge thins as the lid goes down (a thin line where the lids meet, not a crescent), and
  // the rising lower lid starts a little under its edge; both fade outside the corners with the taper. An export
  // written before them (no `lash`, `lower_skip`) draws the lid as it did.
  const lash = f((lid.lash ?? 0) * eyeW);
  const thin = f(closure * (1 - (lid.lash_keep ?? 1)));
  const skip = f(closure * (lid.lower_skip ?? 0) * eyeW);
  for (let x = x0; x < x1; x++) {
    const top = rowAt(upper, x);
    const low = Math.max(rowAt(lower, x), top);
    const beyond = f(Math.max(Math.max(f(left - x), f(x - right)), 0) / fifth);
    const taper = Math.min(Math.max(f(1 - beyond), 0), 1);
    const gap = f(f(low - top) * taper);
    const meet = f(top + f(meetShare * gap));
    const newTop = f(top + f(c * f(meet - top)));
    const newLow = f(low - f(f(c * f(low - meet)) * taper));
    const lidTop = f(top - reach32);
    const belowReach = f(low + half);
    const lashOut = f(lash * f(1 - f(thin * taper)));
    const lowSrc = f(low + f(skip * taper));
    const skinSrc = f(top - lash), skinDst = f(newTop - lashOut);
    const skinScale = f(skinSrc - lidTop), skinSpan = Math.max(f(skinDst - lidTop), eps);
    const lashSpan = Math.max(lashOut, eps);
    const lowerScale = f(belowReach - lowSrc), lowerSpan = Math.max(f(belowReach - newLow), eps);
    for (let y = y0; y < y1; y++) {
      let sy;
      if (y >= lidTop && y < skinDst) sy = f(lidTop + f(f(f(y - lidTop) * skinScale) / skinSpan));
      else if (y >= skinDst && y <= newTop) sy = f(skinSrc + f(f(f(y - skinDst) * lash) / lashSpan));
      else if (y >= newLow && y <= belowReach) sy = f(lowSrc + f(f(f(y - newLow) * lowerScale) / lowerSpan));
      else continue; // the map is the identity here: the copy already holds this pixel
      sample(dst, src, width, height, x, y, sy);
    }
  }
}

/** One output pixel (x, y) from the source at column x, row sy: cv2.remap's fixed-point bilinear, replicated border. */
function sample(dst, src, width, height, x, y, sy) {
  const q = roundHalfEven(sy * TAB); // cvRound of map * INTER_TAB_SIZE (float32 times 32 is exact)
  const iy = Math.floor(q / TAB), fy = q - iy * TAB;
  const r0 = Math.min(Math.max(iy, 0), height - 1), r1 = Math.min(Math.max(iy + 1, 0), height - 1);
  // the map's columns are whole pixels: only the rows mix; weights (32 - fy) and fy out of 32, rounded half up
  const a = (r0 * width + x) * 4, b = (r1 * width + x) * 4, o = (y * width + x) * 4;
  const w0 = TAB - fy;
  for (let ch = 0; ch < 4; ch++) dst[o + ch] = (src[a + ch] * w0 + src[b + ch] * fy + TAB / 2) >> 5;
}

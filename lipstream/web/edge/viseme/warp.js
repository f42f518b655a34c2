// Port of lipstream/engines/viseme/warp.py render_patch: a smooth backward warp of the avatar's own lips and
// jaw plus a drawn mouth interior. Keep it in step with the Python, function by function.
//
// A frame's "base" is its 256² crop packed as Uint32 RGBA with the mouth mask in alpha (little-endian:
// r | g << 8 | b << 16 | mask << 24). render writes the patch in the same packing: one Uint32 per pixel.

const N_CONTOUR = 11;

/** MouthGeometry.unpack of one packed row (51 numbers). */
export function unpackGeometry(row) {
  const upper = [], lower = [];
  for (let i = 0; i < N_CONTOUR; i++) {
    upper.push([row[2 * i], row[2 * i + 1]]);
    lower.push([row[2 * N_CONTOUR + 2 * i], row[2 * N_CONTOUR + 2 * i + 1]]);
  }
  const h = 4 * N_CONTOUR;
  return {
    upper, lower,
    centerX: row[h], halfWidth: row[h + 1], upperOuterY: row[h + 2], lowerOuterY: row[h + 3],
    chinY: row[h + 4], noseY: row[h + 5], lipY: row[h + 6],
  };
}

/** _interp_contour: the contour's row at each column of xs (clamped at the corners). */
export function interpContour(contour, xs) {
  const order = contour.map((p, i) => i).sort((a, b) => contour[a][0] - contour[b][0]);
  const px = order.map((i) => contour[i][0]);
  const py = order.map((i) => contour[i][1]);
  const out = new Float64Array(xs.length);
  const n = px.length;
  for (let j = 0; j < xs.length; j++) {
    const x = xs[j];
    if (x <= px[0]) { out[j] = py[0]; continue; }
    if (x >= px[n - 1]) { out[j] = py[n - 1]; continue; }
    let i = 1;
    while (px[i] < x) i++;
    const t = (x - px[i - 1]) / (px[i] - px[i - 1]);
    out[j] = py[i - 1] + t * (py[i] - py[i - 1]);
  }
  return out;
}

const clip = (v, lo, hi) => (v < lo ? lo : v > hi ? hi : v);

/** _tooth_phase: 0 in the middle of a tooth, 0.5 at the seam between two (central pair at the midline). */
const toothPhase = (u, pitch) => Math.abs((((u / pitch) % 1.0) + 1.0) % 1.0 - 0.5);

/** _seam_shade: brightness across a tooth row, 1 on a tooth and a soft dark seam between two. */
const seamShade = (phase, depth = 0.3) => 1.0 - depth * Math.exp(-(((0.5 - phase) / 0.07) ** 2));

/** chin_drop: the chin's drop in pixels, eased to stay within `room` of the rows under the chin. */
export function chinDrop(drop, chinY, size, room) {
  const limit = room * (size - 1 - chinY);
  if (limit <= 0.0) return 0.0;
  return limit * Math.tanh(drop / limit); // a tanh knee, as warp.chin_drop (issue 37)
}

/** below_chin_fade: share of the jaw's drop kept on row y, 0 at the crop's last row (no step at its edge). */
export function belowChinFade(y, chinY, sigma, size) {
  const under = Math.max(y - chinY, 0.0);
  const ramp = y > chinY ? clip((size - 1 - y) / Math.max(size - 1 - chinY, 1.0), 0, 1) : 1.0;
  return Math.exp(-(under ** 2) / (2 * sigma * sigma)) * ramp;
}

/** cv2.remap INTER_LINEAR + BORDER_REPLICATE of one pixel, in OpenCV's fixed point (1/32 px, 15-bit weights). */
function remapPixel(src8, size, mx, my, rgb) {
  const X = Math.round(mx * 32);
  const Y = Math.round(my * 32);
  const ax = X & 31, ay = Y & 31;
  const sx = X >> 5, sy = Y >> 5;
  const x0 = clip(sx, 0, size - 1), x1 = clip(sx + 1, 0, size - 1);
  const y0 = clip(sy, 0, size - 1), y1 = clip(sy + 1, 0, size - 1);
  const w00 = (32 - ax) * (32 - ay), w01 = ax * (32 - ay), w10 = (32 - ax) * ay, w11 = ax * ay;
  const p00 = (y0 * size + x0) * 4, p01 = (y0 * size + x1) * 4, p10 = (y1 * size + x0) * 4, p11 = (y1 * size + x1) * 4;
  for (let c = 0; c < 3; c++) {
    const v = w00 * src8[p00 + c] + w01 * src8[p01 + c] + w10 * src8[p10 + c] + w11 * src8[p11 + c];
    rgb[c] = (v + 512) >> 10;
  }
}

/**
 * render_patch: write the patch for one articulation row into out32 (Uint32Array size²).
 * base32: the frame's packed crop + mask; geo: unpackGeometry(row); feature: [open, width, closure, labiodental];
 * cfg: WarpConfig as in engine.json. Returns false when the row is at rest (out32 is then the base).
 */
export function renderPatch(base32, size, geo, feature, cfg, out32) {
  out32.set(base32);
  const closure = clip(feature[2], 0, 1);
  const opening = feature[0] * (1.0 - closure);
  const width = feature[1];
  const labio = clip(feature[3], 0, 1); // f/v: from phoneme timings only
  if (opening <= 1e-4 && Math.abs(width) <= 1e-4 && closure <= 1e-4 && labio <= 1e-4) return false;
  const src8 = new Uint8Array(base32.buffer, base32.byteOffset, base32.byteLength);
  const W = geo.halfWidth;
  const r0 = Math.floor(geo.noseY) + 1;
  const c0 = Math.max(Math.trunc(geo.centerX - cfg.roi_half_width * W), 0);
  const c1 = Math.min(Math.trunc(geo.centerX + cfg.roi_half_width * W) + 1, size);
  if (r0 >= size || c1 <= c0) return true;
  const nc = c1 - c0;
  const nr = size - r0;

  // Per column: u, phi, profile, jaw; per row: above, below, vert, fade.
  const u = new Float64Array(nc), phi = new Float64Array(nc), profile = new Float64Array(nc), jaw = new Float64Array(nc);
  const rounding = Math.max(-width, 0.0);
  const narrow = 1.0 - cfg.round_narrow * rounding;
  const taper = cfg.corner_taper * (1.0 - cfg.round_taper * rounding);
  for (let j = 0; j < nc; j++) {
    const x = c0 + j;
    u[j] = (x - geo.centerX) / W;
    const au = Math.abs(u[j]);
    phi[j] = clip(u[j], -1, 1) * Math.exp(-(Math.max(au - 1.0, 0.0) ** 2) / 0.6);
    jaw[j] = Math.exp(-((u[j] / 1.3) ** 4));
  }
  const above = new Float64Array(nr), vert = new Float64Array(nr), fade = new Float64Array(nr);
  const sigma = 0.5 * W;
  for (let i = 0; i < nr; i++) {
    const y = r0 + i;
    above[i] = clip((y - geo.noseY) / Math.max(geo.lipY - geo.noseY, 1.0), 0, 1) ** 1.5;
    const below = Math.exp(-(((y - geo.lipY) / (0.9 * W)) ** 2));
    vert[i] = y < geo.lipY ? above[i] : below;
    fade[i] = belowChinFade(y, geo.chinY, sigma, size);
  }
  const dxScale = (width > 0 ? cfg.spread : cfg.round_in) * W * width;
  // The lip line's horizontal shift decides where the contours are read.
  const lipRow = Math.min(Math.max(Math.trunc(geo.lipY) - r0, 0), nr - 1);
  const xSrcLine = new Float64Array(nc);
  for (let j = 0; j < nc; j++) xSrcLine[j] = c0 + j - dxScale * phi[j] * vert[lipRow];
  const upper = interpContour(geo.upper, xSrcLine);
  const lower = interpContour(geo.lower, xSrcLine);
  // The parting closes at the inner-lip corners.
  let innerL = Infinity, innerR = -Infinity;
  for (const p of geo.upper.concat(geo.lower)) { innerL = Math.min(innerL, p[0]); innerR = Math.max(innerR, p[0]); }
  const innerC = 0.5 * (innerL + innerR), innerW = Math.max(0.5 * (innerR - innerL), 1.0);
  for (let j = 0; j < nc; j++) {
    profile[j] = clip(1.0 - ((xSrcLine[j] - innerC) / innerW / narrow) ** 2, 0, 1) ** taper;
  }

  // The jaw carries the chin, lower lip and lower teeth; the lips part a little more on top of it.
  const jawDrop = cfg.jaw_drop * W * opening;
  const lipPart = cfg.lip_part * W * opening;
  const chin = chinDrop(jawDrop, geo.chinY, size, cfg.chin_room);
  const us = cfg.upper_share;
  const closeUpper = cfg.close_upper_share ?? 0.5; // older exports: the lips met halfway
  const chinSpan = Math.max(geo.chinY - geo.lipY, 1.0);
  // First pass over columns: the lip edges, and the opening's height at its tallest and its floor
  // (_shade_interior's `full` and `floor`).
  const colUpperDst = new Float64Array(nc), colLowerDst = new Float64Array(nc), colShown = new Float64Array(nc);
  const colDUp = new Float64Array(nc), colDLowLip = new Float64Array(nc), colDLowJaw = new Float64Array(nc);
  const colTuck = new Float64Array(nc);
  let full = -Infinity, floor = -Infinity;
  for (let j = 0; j < nc; j++) {
    const gap = lower[j] - upper[j];
    const close = closure * gap;
    // f/v: the lower lip rises in front of the upper teeth (covers them, does not squeeze them)
    colTuck[j] = labio * cfg.labiodental_tuck * gap;
    const closeUp = closeUpper * close;
    colDUp[j] = (us * lipPart + labio * cfg.labiodental_lift * W) * profile[j] - closeUp;
    colDLowLip[j] = (cfg.jaw_lip * jawDrop + (1.0 - us) * lipPart) * profile[j] - (close - closeUp) - colTuck[j];
    colDLowJaw[j] = chin * jaw[j];
    colUpperDst[j] = upper[j] - colDUp[j];
    colLowerDst[j] = lower[j] + colDLowLip[j];
    colShown[j] = Math.min(gap - close, cfg.teeth_ride_max * W); // an open source mouth's interior is drawn over
    full = Math.max(full, colLowerDst[j] - (colUpperDst[j] + colShown[j]));
    floor = Math.max(floor, colLowerDst[j]);
  }
  const grow = clip((full - 5.0) / 8.0, 0, 1);
  const lowerTeethRgb = cfg.lower_teeth_rgb;
  const cavity = cfg.cavity_rgb, throat = cfg.throat_rgb, tongueRgb = cfg.tongue_rgb, teethRgb = cfg.teeth_rgb;
  const edge = cfg.edge_px;
  const rgb = [0, 0, 0];
  const col = [0, 0, 0];
  const lip = [0, 0, 0];
  const abovePx = [0, 0, 0];
  /** Source row for the pixel at row y of column j: the lip side (below its edge) or what lies above. */
  const sourceRow = (i, j, lipSide) => {
    const y = r0 + i;
    const upperDst = colUpperDst[j], lowerDst = colLowerDst[j], shown = colShown[j];
    if (y <= upperDst) {
      // the full shift is reached at the new lip edge itself (no step in the map there)
      return y + colDUp[j] * clip((y - geo.noseY) / Math.max(upperDst - geo.noseY, 1.0), 0, 1) ** 1.5;
    }
    if (lipSide) {
      const t = clip((y - lowerDst) / chinSpan, 0, 1);
      const dLow = colDLowLip[j] * (1.0 - t) + colDLowJaw[j] * t;
      return y - dLow * fade[i];
    }
    const spanUntucked = Math.max(lowerDst - upperDst, 1e-3) + colTuck[j];
    if (spanUntucked <= shown) return upper[j] + ((y - upperDst) * shown) / spanUntucked;
    return upper[j] + Math.min(y - upperDst, shown);
  };
  /** The warped (pre-interior) pixel at row index i of column j into out; the lower lip's edge anti-aliased. */
  const warpAt = (i, j, out) => {
    const y = r0 + i, x = c0 + j;
    const weight = src8[(y * size + x) * 4 + 3] / 255;
    const mapX = x - dxScale * phi[j] * vert[i] * weight;
    const cover = clip(y - colLowerDst[j] + 0.5, 0, 1);
    remapPixel(src8, size, mapX, y + (sourceRow(i, j, cover > 0) - y) * weight, out);
    if (cover > 0 && cover < 1) {
      remapPixel(src8, size, mapX, y + (sourceRow(i, j, false) - y) * weight, abovePx);
      for (let c = 0; c < 3; c++) out[c] = Math.trunc(out[c] * cover + abovePx[c] * (1.0 - cover) + 0.5);
    }
  };
  for (let j = 0; j < nc; j++) {
    const upperDst = colUpperDst[j], lowerDst = colLowerDst[j], shown = colShown[j];
    const span = Math.max(lowerDst - upperDst, 1e-3);
    const top = upperDst + shown;
    const height = lowerDst - top;
    const strength = clip(height / 3.0, 0, 1);
    const side = clip(1.0 - 0.6 * u[j] * u[j], 0.25, 1.0);
    const litScale = 0.5 * Math.max(height, 1.0) + 1.5;
    const depth = 0.55 + 0.45 * side;
    const dome = clip(1.0 - (u[j] / 0.7) ** 2, 0, 1);
    const tTop = floor - 0.5 * full * grow * dome;
    const tongueCol = clip(lowerDst - tTop, 0, 1);
    const soft = 0.12 * full + 1.5;
    const tSide = 0.55 + 0.45 * Math.sqrt(dome);
    // f/v: the lower lip hides them; at most a share of the opening's height (the lip hides the rest)
    const ltHeight = Math.min(cfg.lower_teeth_height * W, cfg.lower_teeth_share * full) * grow * (1.0 - labio);
    const ltTop = lowerDst - cfg.rim_px - ltHeight;
    // one tooth per pitch, the central pair meeting at the midline: rounded tips, shallow seams; a row
    // under ~2 px tall would read as a line along the lip, so it fades out
    const d = toothPhase(u[j], cfg.lower_teeth_pitch);
    const tip = ltTop + 0.2 * ltHeight * (2.0 * d) ** 4;
    const ltSeen = clip((ltHeight - 1.5) / 2.0, 0, 1);
    const ltCols = Math.exp(-((u[j] / 0.42) ** 4)) * seamShade(d, cfg.lower_teeth_seam) * ltSeen;
    const ltSide = 0.85 + 0.15 * side;
    const rimStrength = clip(height / 4.0, 0, 1);
    const teethH = Math.max(Math.max(Math.min(0.35 * span, 0.18 * W), labio * span) - shown, 0.0);
    const teethCol = clip(1.0 - (Math.abs(u[j]) / 0.75) ** 4, 0, 1);
    // drawn upper teeth: rounded biting corners, soft seams, darker towards the corners
    const dUpper = toothPhase(u[j], cfg.upper_teeth_pitch);
    const teethEdge = top + teethH * (1.0 - 0.3 * (2.0 * dUpper) ** 4);
    const teethShade = (0.7 + 0.3 * side) * seamShade(dUpper);
    const x = c0 + j;
    let lipRead = false;
    for (let i = 0; i < nr; i++) {
      const y = r0 + i;
      const p = y * size + x;
      const m = src8[p * 4 + 3];
      const inside = clip((y - top) / edge + 0.5, 0, 1) * clip((lowerDst - y) / edge + 0.5, 0, 1);
      const alpha = inside * strength;
      // outside the mask nothing moves (the map is the pixel itself): out32 already holds it, unless the
      // interior is drawn there
      if (m === 0 && !(alpha > 0)) continue;
      if (m === 0) for (let c = 0; c < 3; c++) rgb[c] = src8[p * 4 + c];
      else warpAt(i, j, rgb);
      if (alpha > 0) {
        if (!lipRead) {
          // the lower lip's own colour just under the opening (its inner side rolls into the mouth)
          warpAt(clip(Math.trunc(lowerDst + 2.5) - r0, 0, nr - 1), j, lip);
          lipRead = true;
        }
        // _shade_interior: lit walls over a dark throat, the tongue, lower incisors, the lip's rim, drawn upper teeth.
        const lit = Math.exp(-(lowerDst - y) / litScale) * side;
        for (let c = 0; c < 3; c++) col[c] = throat[c] * depth + (cavity[c] - throat[c] * depth) * lit;
        if (grow > 0) {
          const cover = clip((y - tTop) / soft, 0, 1) * tongueCol;
          const sheen = 0.6 + 0.4 * clip((y - tTop) / Math.max(lowerDst - tTop, 1.0), 0, 1);
          const tShade = sheen * tSide;
          for (let c = 0; c < 3; c++) col[c] = col[c] * (1.0 - cover) + tongueRgb[c] * tShade * cover;
          const ltCover = clip((y - tip) / 1.8, 0, 1) * ltCols;
          const ltDown = clip((y - ltTop) / (ltHeight + cfg.rim_px), 0, 1);
          const ltShade = cfg.lower_teeth_shade * (1.0 - 0.2 * ltDown) * ltSide;
          for (let c = 0; c < 3; c++) col[c] = col[c] * (1.0 - ltCover) + lowerTeethRgb[c] * ltShade * ltCover;
        }
        const rim = Math.exp(-Math.max(lowerDst - y, 0.0) / cfg.rim_px) * rimStrength;
        for (let c = 0; c < 3; c++) col[c] = col[c] * (1.0 - rim) + lip[c] * cfg.rim_shade * rim;
        const teeth = clip(teethEdge - y, 0, 1) * teethCol;
        const tShadeY = teethShade * (0.82 + 0.18 * clip((y - top) / Math.max(teethH, 1.0), 0, 1));
        for (let c = 0; c < 3; c++) {
          const interior = col[c] * (1.0 - teeth) + teethRgb[c] * tShadeY * teeth;
          rgb[c] = Math.trunc(rgb[c] * (1.0 - alpha) + interior * alpha + 0.5);
        }
      }
      out32[p] = (rgb[0] | (rgb[1] << 8) | (rgb[2] << 16) | (m << 24)) >>> 0;
    }
  }
  if (Math.abs(width) > 1e-4) {
    let up = -Infinity, down = -Infinity;
    for (let j = 0; j < nc; j++) { up = Math.max(up, colDUp[j]); down = Math.max(down, colDLowLip[j]); }
    lipShapePass(src8, out32, size, geo, r0, c0, c1, u, up, down, width, W, cfg);
  }
  return true;
}

/**
 * _lip_shape_map and its second remap: spread raises the corners and thins the lips, rounding makes them
 * fuller (a vertical scale about the mouth's centre, fading off the lips); displacements scaled by the mask.
 */
function lipShapePass(src8, out32, size, geo, r0, c0, c1, u, up, down, width, W, cfg) {
  const first = new Uint8Array(out32.buffer.slice(out32.byteOffset, out32.byteOffset + out32.byteLength));
  const spread = Math.max(width, 0.0), rounding = Math.max(-width, 0.0);
  const top = geo.upperOuterY - up, bottom = geo.lowerOuterY + down;
  const cy = 0.5 * (top + bottom);
  const sy = Math.max(0.5 * (bottom - top), 2.0) * 1.25;
  const scale = cfg.spread_thin * spread - cfg.round_full * rounding; // > 0 samples farther out: thinner
  const px = [0, 0, 0];
  // the rows' own terms, once a row (the same values as per pixel: each product keeps its order)
  const rowEnv = new Float64Array(size), rowLift = new Float64Array(size);
  for (let y = r0; y < size; y++) {
    rowEnv[y] = Math.exp(-(((y - cy) / sy) ** 2));
    rowLift[y] = Math.exp(-(((y - cy) / (1.5 * sy)) ** 2));
  }
  for (let j = 0; j < c1 - c0; j++) {
    const x = c0 + j;
    const envU = Math.exp(-((u[j] / 1.15) ** 4));
    const corner = Math.min(u[j] * u[j], 1.0) * Math.exp(-(Math.max(Math.abs(u[j]) - 1.0, 0.0) ** 2) / 0.6);
    const liftU = cfg.spread_lift * W * spread * corner;
    for (let y = r0; y < size; y++) {
      const p = y * size + x;
      if (src8[p * 4 + 3] === 0) continue; // outside the mask the map is the pixel itself: out32 holds it
      const weight = src8[p * 4 + 3] / 255;
      const env = rowEnv[y] * envU;
      const lift = liftU * rowLift[y];
      const mapY = y + (scale * (y - cy) * env + lift) * weight;
      remapPixel(first, size, x, mapY, px);
      out32[p] = (px[0] | (px[1] << 8) | (px[2] << 16) | (src8[p * 4 + 3] << 24)) >>> 0;
    }
  }
}

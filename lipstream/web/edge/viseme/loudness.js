// Port of lipstream/engines/viseme/loudness.py: loudness-scaled opening, closure gate, easing into rest.
// Feature rows are flat Float64Array [n*3]: open, width, closure.
const OPEN = 0, WIDTH = 1, CLOSURE = 2;

/** loudness: level above the floor relative to the loudest frame in [k-back, k+ahead], 0..1. */
export function loudness(levels, cfg) {
  const n = levels.length;
  const out = new Float64Array(n);
  for (let k = 0; k < n; k++) {
    let ref = -Infinity;
    const a = Math.max(0, k - cfg.back_frames);
    const b = Math.min(n - 1, k + cfg.ahead_frames);
    for (let j = a; j <= b; j++) if (levels[j] > ref) ref = levels[j];
    const span = Math.max(ref - cfg.floor_dbfs, cfg.min_range_db);
    out[k] = Math.fround(Math.min(Math.max((levels[k] - cfg.floor_dbfs) / span, 0), 1));
  }
  return out;
}

/** ClosureGate.apply: keep CLOSURE only where confident and not loud (a sure one may be louder: /m/);
 * a kept closure at or above full_at shuts the lips fully. */
export function gateClosures(feats, loud, gate) {
  const out = Float64Array.from(feats);
  // numpy compares the float32 rows with the limits rounded to float32 (0.45 -> 0.44999998...)
  const minConfidence = Math.fround(gate.min_confidence);
  const maxLoudness = Math.fround(gate.max_loudness);
  // an avatar exported before these limits existed keeps its old gate: no sure tier, closures as confident
  const sure = Math.fround(gate.sure ?? Infinity);
  const maxLoudnessSure = Math.fround(gate.max_loudness_sure ?? -Infinity);
  const fullAt = Math.fround(gate.full_at ?? 0);
  for (let i = 0; i < loud.length; i++) {
    const confidence = out[i * 3 + CLOSURE];
    const keep = (confidence >= minConfidence && loud[i] <= maxLoudness)
      || (confidence >= sure && loud[i] <= maxLoudnessSure);
    const shut = fullAt > 0 ? Math.fround(Math.min(Math.fround(confidence / fullAt), 1)) : confidence;
    out[i * 3 + CLOSURE] = keep ? shut : 0;
  }
  return out;
}

/** scale_opening: OPEN scaled by loudness (closure and width unchanged). */
export function scaleOpening(feats, loud, cfg) {
  const out = Float64Array.from(feats);
  for (let i = 0; i < loud.length; i++) {
    const target = out[i * 3 + OPEN];
    const shaped = (cfg.shape_share * target) / 0.85
      + (1.0 - cfg.shape_share) * loud[i] * Math.min(target / 0.2, 1.0);
    const open = Math.min(Math.max(cfg.open_gain * shaped, 0), 1) ** cfg.open_power;
    out[i * 3 + OPEN] = open * (1.0 - out[i * 3 + CLOSURE]);
  }
  return out;
}

/** ease_to_rest: silent rows closed (pause_closure), opening and spread tapered next to them. silent has
 * n + 2e entries. */
export function easeToRest(feats, silent, cfg) {
  const e = cfg.ease_frames;
  const n = feats.length / 3;
  if (silent.length !== n + 2 * e) throw new Error(`silent mask has ${silent.length} rows, expected ${n + 2 * e}`);
  const out = Float64Array.from(feats);
  for (let i = 0; i < n; i++) {
    let cap = 1;
    for (let d = 1; d <= e; d++) {
      if (silent[e - d + i] || silent[e + d + i]) cap = Math.min(cap, d / (e + 1.0));
    }
    out[i * 3 + OPEN] *= cap;
    out[i * 3 + WIDTH] *= cap;
    if (silent[e + i]) {
      out.fill(0, i * 3, i * 3 + 3);
      out[i * 3 + CLOSURE] = Math.fround(cfg.pause_closure ?? 0); // older exports: the footage's rest
    }
  }
  return out;
}

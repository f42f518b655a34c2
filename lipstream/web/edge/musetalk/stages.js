// Per-stage wall-clock totals (ms) and counts, for the patch timing field and the benchmark.
export class StageTimer {
  constructor() { this.ms = {}; this.count = {}; }
  add(stage, ms) { this.ms[stage] = (this.ms[stage] || 0) + ms; this.count[stage] = (this.count[stage] || 0) + 1; }
  snapshot() { return { ms: { ...this.ms }, count: { ...this.count } }; }
}

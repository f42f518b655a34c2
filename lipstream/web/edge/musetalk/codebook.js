// The 64-bit SimHash codebook of lipstream/render/codebook.py in JS: the signs of the centred feature
// vector's projections on `bits` hyperplanes (shipped by the export, so codes equal Python's), nearest
// entry by popcount(XOR) on two 32-bit halves, a hit at distance <= threshold, LRU eviction when full.
// Patches are RGBA words (Uint32Array, 256² per entry); the alpha lane is rewritten per displayed frame.

export function popcount32(x) {
  x -= (x >>> 1) & 0x55555555;
  x = (x & 0x33333333) + ((x >>> 2) & 0x33333333);
  x = (x + (x >>> 4)) & 0x0f0f0f0f;
  return Math.imul(x, 0x01010101) >>> 24;
}

/** Hamming distance of two codes given as [lo, hi] uint32 halves. */
export function hamming(aLo, aHi, bLo, bHi) {
  return popcount32((aLo ^ bLo) >>> 0) + popcount32((aHi ^ bHi) >>> 0);
}

export class SimHashCodebook {
  /** hyperplanes: Float32Array [bits*dim]; mean: Float32Array [dim] or null (running mean of the first meanWarmup vectors). */
  constructor({ dim, bits = 64, hyperplanes, mean = null, meanCount = null, meanWarmup = 200, maxEntries = 512, threshold = 2, patchWords = 256 * 256 }) {
    if (bits < 1 || bits > 64) throw new Error(`bits must be in 1..64, got ${bits}`);
    if (!hyperplanes || hyperplanes.length !== bits * dim) throw new Error(`the codebook needs ${bits}x${dim} hyperplanes`);
    Object.assign(this, { dim, bits, hyperplanes, meanWarmup, maxEntries, threshold, patchWords });
    this.mean = new Float64Array(dim);
    if (mean) this.mean.set(mean);
    this.meanCount = meanCount ?? (mean ? meanWarmup : 0);
    this.codes = new Uint32Array(2 * maxEntries);
    this.patches = new Array(maxEntries).fill(null);
    this.uses = new Float64Array(maxEntries);
    this.lastUsed = new Float64Array(maxEntries);
    this.size = 0;
    this.hits = 0; this.misses = 0; this.evictions = 0; this.tick = 0;
    this.dirty = new Set(); // slots changed since the last save
  }

  /** SimHash codes of vectors [n*dim]: Uint32Array [2n] of (lo, hi) halves. */
  hash(features) {
    const n = features.length / this.dim;
    this._updateMean(features, n);
    const out = new Uint32Array(2 * n);
    const centred = new Float32Array(this.dim);
    const meanF32 = Float32Array.from(this.mean);
    for (let v = 0; v < n; v++) {
      const row = features.subarray(v * this.dim, (v + 1) * this.dim);
      for (let i = 0; i < this.dim; i++) centred[i] = row[i] - meanF32[i];
      let lo = 0, hi = 0;
      for (let b = 0; b < this.bits; b++) {
        const plane = this.hyperplanes.subarray(b * this.dim, (b + 1) * this.dim);
        let acc = 0;
        for (let i = 0; i < this.dim; i++) acc += centred[i] * plane[i];
        if (acc > 0) { if (b < 32) lo |= 1 << b; else hi |= 1 << (b - 32); }
      }
      out[2 * v] = lo >>> 0; out[2 * v + 1] = hi >>> 0;
    }
    return out;
  }

  /** Nearest entry: { patch, entry, distance } (patch null on a miss); counts a hit or a miss. */
  lookup(lo, hi) {
    this.tick++;
    if (this.size === 0) { this.misses++; return { patch: null, entry: -1, distance: this.bits + 1 }; }
    let best = -1, bestD = Infinity;
    for (let e = 0; e < this.size; e++) {
      const d = hamming(lo, hi, this.codes[2 * e], this.codes[2 * e + 1]);
      if (d < bestD) { bestD = d; best = e; }
    }
    if (bestD > this.threshold) { this.misses++; return { patch: null, entry: -1, distance: bestD }; }
    this.hits++;
    this.uses[best]++;
    this.lastUsed[best] = this.tick;
    this.dirty.add(best);
    return { patch: this.patches[best], entry: best, distance: bestD };
  }

  /** Store a patch (Uint32Array of patchWords) under a code, evicting the least recently used when full. */
  insert(lo, hi, patch) {
    if (patch.length !== this.patchWords) throw new Error(`patch has ${patch.length} words, the codebook ${this.patchWords}`);
    this.tick++;
    let slot;
    if (this.size < this.maxEntries) slot = this.size++;
    else {
      slot = 0;
      for (let e = 1; e < this.size; e++) if (this.lastUsed[e] < this.lastUsed[slot]) slot = e;
      this.evictions++;
    }
    this.codes[2 * slot] = lo; this.codes[2 * slot + 1] = hi;
    this.patches[slot] = patch;
    this.uses[slot] = 1;
    this.lastUsed[slot] = this.tick;
    this.dirty.add(slot);
    return slot;
  }

  _updateMean(features, n) {
    const room = this.meanWarmup - this.meanCount;
    if (room <= 0 || n === 0) return;
    const take = Math.min(room, n);
    const total = this.meanCount + take;
    for (let i = 0; i < this.dim; i++) {
      let sum = 0;
      for (let v = 0; v < take; v++) sum += features[v * this.dim + i];
      this.mean[i] = (this.mean[i] * this.meanCount + sum) / total;
    }
    this.meanCount = total;
  }

  /** Settings that must match for a stored codebook to be reused. */
  signature() {
    return { dim: this.dim, bits: this.bits, patchWords: this.patchWords, maxEntries: this.maxEntries };
  }
}

/** Read the export's seed (see docs/web-export.md, "MuseTalk engine"): hyperplanes, mean and entries. */
export function codebookFromSeed(meta, buffer, { threshold = meta.threshold, maxEntries = meta.maxEntries } = {}) {
  const { dim, bits, entries } = meta;
  const patchBytes = meta.patchSize * meta.patchSize * 3;
  const expected = 4 * bits * dim + 4 * dim + 8 * entries + entries * patchBytes;
  if (buffer.byteLength !== expected) throw new Error(`${meta.file}: ${buffer.byteLength} bytes, expected ${expected} (corrupted export?)`);
  let off = 0;
  const hyperplanes = new Float32Array(buffer.slice(off, off += 4 * bits * dim));
  const mean = new Float32Array(buffer.slice(off, off += 4 * dim));
  const book = new SimHashCodebook({ dim, bits, hyperplanes, mean, meanCount: meta.meanCount, meanWarmup: meta.meanWarmup,
    maxEntries: Math.max(maxEntries, entries), threshold, patchWords: meta.patchSize * meta.patchSize });
  const codes = new Uint32Array(buffer.slice(off, off += 8 * entries));
  const rgb = new Uint8Array(buffer, off, entries * patchBytes);
  for (let e = 0; e < entries; e++) {
    const patch = new Uint32Array(book.patchWords);
    const base = e * patchBytes;
    for (let p = 0; p < book.patchWords; p++) {
      const q = base + 3 * p;
      patch[p] = (0xff000000 | (rgb[q + 2] << 16) | (rgb[q + 1] << 8) | rgb[q]) >>> 0;
    }
    book.insert(codes[2 * e], codes[2 * e + 1], patch);
  }
  book.dirty.clear();
  return book;
}

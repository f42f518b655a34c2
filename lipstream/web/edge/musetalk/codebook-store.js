// The codebook persisted in IndexedDB, one per avatar + engine variant: a meta record (codes, counters,
// mean) and one record per patch slot, so saving after an utterance writes only the slots that changed.

const DB_NAME = 'lipstream-codebooks';
const META = 'meta';
const PATCHES = 'patches';

function request(req) {
  return new Promise((resolve, reject) => { req.onsuccess = () => resolve(req.result); req.onerror = () => reject(req.error); });
}

function done(tx) {
  return new Promise((resolve, reject) => { tx.oncomplete = resolve; tx.onerror = () => reject(tx.error); tx.onabort = () => reject(tx.error); });
}

export async function openCodebookDb(indexedDB = globalThis.indexedDB) {
  const req = indexedDB.open(DB_NAME, 1);
  req.onupgradeneeded = () => {
    req.result.createObjectStore(META);
    req.result.createObjectStore(PATCHES);
  };
  return request(req);
}

/** Write what changed since the last save (all slots the first time). */
export async function saveCodebook(db, key, book) {
  const tx = db.transaction([META, PATCHES], 'readwrite');
  tx.objectStore(META).put({
    version: 1, ...book.signature(), size: book.size, threshold: book.threshold,
    mean: Float32Array.from(book.mean), meanCount: book.meanCount, meanWarmup: book.meanWarmup,
    hyperplanes: book.hyperplanes, codes: book.codes.slice(0, 2 * book.size),
    uses: book.uses.slice(0, book.size), lastUsed: book.lastUsed.slice(0, book.size),
    counters: [book.hits, book.misses, book.evictions, book.tick],
  }, key);
  const patches = tx.objectStore(PATCHES);
  for (const slot of book.dirty) patches.put(book.patches[slot], `${key}/${slot}`);
  book.dirty.clear();
  await done(tx);
}

/** Restore a saved codebook into `book` (same settings) and return true; false when none or settings differ. */
export async function loadCodebookInto(db, key, book) {
  const tx = db.transaction([META, PATCHES], 'readonly');
  const meta = await request(tx.objectStore(META).get(key));
  const sig = book.signature();
  if (!meta || meta.version !== 1 || Object.keys(sig).some((k) => meta[k] !== sig[k])) return false;
  const slots = await Promise.all(Array.from({ length: meta.size }, (_, s) => request(tx.objectStore(PATCHES).get(`${key}/${s}`))));
  if (slots.some((p) => !p || p.length !== book.patchWords)) return false;
  book.hyperplanes = meta.hyperplanes;
  book.mean.set(meta.mean);
  book.meanCount = meta.meanCount;
  book.size = meta.size;
  book.codes.set(meta.codes);
  book.uses.set(meta.uses);
  book.lastUsed.set(meta.lastUsed);
  slots.forEach((p, s) => { book.patches[s] = p; });
  [book.hits, book.misses, book.evictions, book.tick] = meta.counters;
  book.dirty.clear();
  return true;
}

// Fetching the export's files with messages that name the file; image packs (one file, N images).

/** An Error whose message names the export file and what is wrong with it. */
export class ExportFileError extends Error {
  constructor(file, problem) {
    super(`${file}: ${problem}`);
    this.file = file;
  }
}

/** The file's bytes, checked against export.json's size and sha256 when it lists them. */
export async function fetchChecked(manifest, baseUrl, file, { verify = true } = {}) {
  let response;
  try {
    response = await fetch(new URL(file, baseUrl));
  } catch (err) {
    throw new ExportFileError(file, `cannot be fetched (${err.message})`);
  }
  if (!response.ok) throw new ExportFileError(file, `is missing (HTTP ${response.status}); re-export the avatar`);
  const bytes = new Uint8Array(await response.arrayBuffer());
  const meta = manifest.files && manifest.files[file];
  if (verify && meta) {
    if (bytes.length !== meta.bytes) {
      throw new ExportFileError(file, `is corrupted (${bytes.length} bytes, export.json says ${meta.bytes}); re-export the avatar`);
    }
    const digest = new Uint8Array(await crypto.subtle.digest('SHA-256', bytes));
    const hex = [...digest].map((b) => b.toString(16).padStart(2, '0')).join('');
    if (hex !== meta.sha256) throw new ExportFileError(file, 'is corrupted (sha256 differs from export.json); re-export the avatar');
  }
  return bytes;
}

/** Decode image i of a pack (offsets from export.json) to RGBA pixels of a size×size canvas. */
export async function decodePackImage(bytes, offsets, i, type, size, file) {
  const blob = new Blob([bytes.subarray(offsets[i], offsets[i + 1])], { type });
  let bitmap;
  try {
    bitmap = await createImageBitmap(blob, { colorSpaceConversion: 'none', premultiplyAlpha: 'none' });
  } catch (err) {
    throw new ExportFileError(file, `image ${i} cannot be decoded (${err.message}); re-export the avatar`);
  }
  if (bitmap.width !== size || bitmap.height !== size) {
    throw new ExportFileError(file, `image ${i} is ${bitmap.width}x${bitmap.height}, expected ${size}x${size}`);
  }
  const canvas = new OffscreenCanvas(size, size);
  const ctx = canvas.getContext('2d', { willReadFrequently: true });
  ctx.drawImage(bitmap, 0, 0);
  bitmap.close();
  return ctx.getImageData(0, 0, size, size).data;
}

/** Per source frame: its crop RGB with its mouth mask in alpha, packed as Uint32 (one write per pixel). */
export async function loadMouthBases(manifest, baseUrl) {
  const size = manifest.crop_size;
  const crops = manifest.viseme.crops;
  const masks = manifest.masks;
  const [cropBytes, maskBytes] = await Promise.all([
    fetchChecked(manifest, baseUrl, crops.file), fetchChecked(manifest, baseUrl, masks.file),
  ]);
  const bases = [];
  for (let i = 0; i < manifest.frame_count; i++) {
    if (crops.offsets[i] === crops.offsets[i + 1]) { bases.push(null); continue; } // never shown: not exported
    const [rgba, mask] = await Promise.all([
      decodePackImage(cropBytes, crops.offsets, i, 'image/jpeg', size, crops.file),
      decodePackImage(maskBytes, masks.offsets, i, 'image/png', size, masks.file),
    ]);
    const base = new Uint32Array(rgba.buffer.slice(0));
    const base8 = new Uint8Array(base.buffer);
    for (let p = 0, n = size * size; p < n; p++) base8[p * 4 + 3] = mask[p * 4];
    bases.push(base);
  }
  return bases;
}

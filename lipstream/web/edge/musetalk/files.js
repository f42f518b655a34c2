// Fetching the export's files with their sha256 checked against export.json, so a missing or corrupted
// file fails at load with a message naming it (never a hang, never a garbage model).

export class ExportFileError extends Error {}

function hex(buffer) {
  return Array.from(new Uint8Array(buffer), (b) => b.toString(16).padStart(2, '0')).join('');
}

/** Bytes of `path` (relative to the export folder); checks size and sha256 when `expected` has them. */
export async function fetchChecked(baseUrl, path, expected = {}, { signal, timeoutMs = 120000 } = {}) {
  const url = new URL(path, baseUrl);
  const timeout = AbortSignal.timeout(timeoutMs);
  let response;
  try {
    response = await fetch(url, { signal: signal ? AbortSignal.any([signal, timeout]) : timeout });
  } catch (err) {
    throw new ExportFileError(`model file ${path} could not be fetched (${err.name === 'TimeoutError' ? 'timed out' : err.message})`);
  }
  if (!response.ok) throw new ExportFileError(`model file ${path} is missing from the export (HTTP ${response.status}); re-run lipstream export web`);
  const bytes = await response.arrayBuffer();
  if (expected.bytes !== undefined && bytes.byteLength !== expected.bytes) {
    throw new ExportFileError(`model file ${path} has ${bytes.byteLength} bytes, export.json says ${expected.bytes} (truncated or corrupted copy); re-run lipstream export web`);
  }
  if (expected.sha256) {
    const digest = hex(await crypto.subtle.digest('SHA-256', bytes));
    if (digest !== expected.sha256) throw new ExportFileError(`model file ${path} does not match its sha256 in export.json (corrupted copy); re-run lipstream export web`);
  }
  return bytes;
}

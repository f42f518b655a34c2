// The weight-free engine's Worker: PCM in, crop-space mouth patches (mask in alpha) out.
import { fetchChecked, loadMouthBases } from '../files.js';
import { warpOpening } from './calibration.js';
import { ArticulationExtractor, StreamingArticulation } from './extractor.js';
import { renderPatch, unpackGeometry } from './warp.js';

const state = { params: null, extractor: null, bases: null, geometry: null, stream: null, utterance: 0, loopAt0: 0 };

async function load(manifest, baseUrl) {
  const bytes = await fetchChecked(manifest, baseUrl, manifest.viseme.file);
  let params;
  try {
    params = JSON.parse(new TextDecoder().decode(bytes));
  } catch (err) {
    throw new Error(`${manifest.viseme.file}: is not valid JSON (${err.message}); re-export the avatar`);
  }
  state.params = params;
  state.manifest = manifest;
  state.extractor = new ArticulationExtractor(params);
  state.geometry = params.geometry.map(unpackGeometry);
  state.bases = await loadMouthBases(manifest, baseUrl);
  return { lookaheadFrames: state.extractor.lookaheadFrames };
}

/** Frames the lips take to leave the footage's own mouth and to return to it (viseme/edges.py; an export made
 * before that has none, and then the page switches in one frame as it used to). */
function edgeFrames() {
  return state.params.edges ? state.params.edges.frames : 0;
}

/** Render one patch for frame k from an articulation row [open, width, closure] and post it (pixels transferred);
 * `release`: one of the frames after the speech, easing back to the footage's mouth. */
function emitRow(utterance, k, row, isLast, release = false) {
  const size = state.manifest.crop_size;
  const loop = state.manifest.loop.frames;
  const t0 = performance.now();
  const open = warpOpening(state.params.opening, row[0]);
  // open, width, closure from the acoustic model; the f/v cue (4th column) comes only from phoneme timings
  const feature = [open, row[1], row[2], 0];
  const sourceFrame = loop[(state.loopAt0 + k) % loop.length];
  const out = new Uint32Array(size * size);
  const moved = renderPatch(state.bases[sourceFrame], size, state.geometry[sourceFrame], feature, state.params.warp, out);
  const render = performance.now() - t0;
  const patch = { utterance, frame: k, sourceFrame, last: isLast, feature: [row[0], row[1], row[2], 0], release,
    rgba: moved ? out.buffer : null, timing: { render } };
  postMessage({ type: 'patch', patch }, moved ? [out.buffer] : []);
}

/** Render rows for frames first.. and post one patch per frame; the utterance starts from the footage's own mouth,
 * so its first rows' closure eases in, and after its last row a few frames ease back (as a Python session does). */
function emit(utterance, first, rows, last) {
  const n = rows.length / 3;
  const edges = edgeFrames();
  for (let i = 0; i < n; i++) {
    const k = first + i;
    const row = [rows[i * 3], rows[i * 3 + 1], rows[i * 3 + 2] * Math.min((k + 1) / (edges + 1), 1)];
    emitRow(utterance, k, row, last && !edges && i === n - 1);
    state.lastRow = { k, row };
  }
  const end = state.lastRow;
  if (last && edges && end) {
    for (let j = 1; j <= edges; j++) {
      const step = 1 - j / (edges + 1);
      emitRow(utterance, end.k + j, end.row.map((v) => v * step), j === edges, true);
    }
  } else if (last && (n === 0 || !end)) {
    postMessage({ type: 'patch', patch: { utterance, frame: -1, last: true, rgba: null } });
  }
}

let loading = null; // the load in progress: an utterance begun before it ends waits for it (a page may
// start playing a file or the server's speech before `ready`; without this the first pushes find no crops)

onmessage = async (event) => {
  const msg = event.data;
  try {
    if (msg.type === 'load') {
      loading = load(msg.manifest, msg.baseUrl);
      const info = await loading;
      postMessage({ type: 'ready', ...info });
      return;
    }
    if (loading) await loading; // messages keep their order: each awaits the same promise, FIFO
    if (msg.type === 'begin') {
      state.utterance = msg.utterance;
      state.loopAt0 = msg.loopFrameAt0 || 0;
      state.stream = new StreamingArticulation(state.extractor);
      state.lastRow = null;
    } else if (msg.type === 'push' && msg.utterance === state.utterance && state.stream) {
      const t0 = performance.now();
      const { first, rows } = state.stream.push(msg.pcm);
      const features = performance.now() - t0;
      if (rows.length) postMessage({ type: 'timing', features });
      emit(msg.utterance, first, rows, false);
    } else if (msg.type === 'end' && msg.utterance === state.utterance && state.stream) {
      const { first, rows } = state.stream.finish();
      emit(msg.utterance, first, rows, true);
      state.stream = null;
    } else if (msg.type === 'cancel') {
      state.stream = null;
      state.utterance = -1;
    }
  } catch (err) {
    postMessage({ type: 'error', message: err.message || String(err) });
  }
};

// The in-browser MuseTalk engine (docs/web-export.md, "The engine interface"): a facade on the main
// thread over engine.worker.js, which does all the work; the main thread only receives patches.

const NAME = 'musetalk';

export function createEngine(manifest, baseUrl, options = {}) {
  const worker = new Worker(new URL('./engine.worker.js', import.meta.url), { type: 'module' });
  const { onPatch = () => {}, onError = () => {}, onStatus = () => {}, onDone = () => {} } = options;
  let utterance = 0;
  let readyResolve, readyReject;
  const ready = new Promise((resolve, reject) => { readyResolve = resolve; readyReject = reject; });
  let loaded = false;
  const engine = {
    name: NAME, patchSize: 256, lookaheadFrames: 2, info: null, ready,
    begin({ loopFrameAt0 = 0 } = {}) { utterance++; worker.postMessage({ type: 'begin', loopFrameAt0, utterance }); },
    push(pcm, { hold = false } = {}) { const copy = Float32Array.from(pcm); worker.postMessage({ type: 'push', pcm: copy, hold }, [copy.buffer]); },
    end() { worker.postMessage({ type: 'end' }); },
    cancel() { worker.postMessage({ type: 'cancel' }); utterance++; },
    stats() {
      return new Promise((resolve) => {
        const listener = (e) => { if (e.data.type === 'stats') { worker.removeEventListener('message', listener); resolve(e.data.stats); } };
        worker.addEventListener('message', listener);
        worker.postMessage({ type: 'stats' });
      });
    },
    close() { worker.terminate(); },
  };
  worker.onmessage = (event) => {
    const m = event.data;
    if (m.type === 'status') onStatus(m.text);
    else if (m.type === 'ready') { loaded = true; engine.info = m.info; readyResolve(); }
    else if (m.type === 'error') {
      const err = new Error(m.message);
      if (!loaded) { worker.terminate(); readyReject(err); } else onError(err);
    } else if (m.type === 'patch') {
      if (m.utterance !== utterance) return; // a cancelled utterance's late patches
      onPatch({ frame: m.frame, sourceFrame: m.sourceFrame, kind: m.kind, last: m.last,
        rgba: m.rgba ? new Uint8ClampedArray(m.rgba) : null, timing: m.timing });
    } else if (m.type === 'done') { if (m.utterance === utterance) onDone(m.stats); }
  };
  worker.onerror = (event) => {
    const err = new Error(`the MuseTalk worker failed: ${event.message || 'script error'}`);
    if (!loaded) readyReject(err); else onError(err);
  };
  worker.postMessage({ type: 'init', manifest, baseUrl: new URL(baseUrl, globalThis.location?.href).href, options: options.engine || {} });
  return engine;
}

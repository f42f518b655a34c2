// The weight-free engine behind the page's engine interface (docs/web-export.md): a Worker does the work.

/** createEngine(manifest, baseUrl, options) -> Engine (see docs/web-export.md). */
export function createEngine(manifest, baseUrl, options = {}) {
  const worker = new Worker(new URL('./worker.js', import.meta.url), { type: 'module' });
  let utterance = 0;
  const engine = {
    name: 'viseme',
    patchSize: manifest.crop_size,
    lookaheadFrames: 0,
    begin({ loopFrameAt0 = 0 } = {}) {
      utterance += 1;
      worker.postMessage({ type: 'begin', utterance, loopFrameAt0 });
    },
    push(pcm) {
      const copy = Float32Array.from(pcm);
      worker.postMessage({ type: 'push', utterance, pcm: copy }, [copy.buffer]);
    },
    end() { worker.postMessage({ type: 'end', utterance }); },
    cancel() { utterance += 1; worker.postMessage({ type: 'cancel' }); },
    close() { worker.terminate(); },
  };
  engine.ready = new Promise((resolve, reject) => {
    worker.onmessage = (event) => {
      const msg = event.data;
      if (msg.type === 'ready') {
        engine.lookaheadFrames = msg.lookaheadFrames;
        resolve();
      } else if (msg.type === 'error') {
        const err = new Error(msg.message);
        reject(err);
        if (options.onError) options.onError(err);
      } else if (msg.type === 'patch') {
        if (msg.patch.utterance !== utterance) return; // a cancelled utterance's leftovers
        const p = msg.patch;
        if (p.rgba) p.rgba = new Uint8ClampedArray(p.rgba);
        if (options.onPatch) options.onPatch(p);
      } else if (msg.type === 'timing' && options.onTiming) {
        options.onTiming(msg);
      }
    };
    worker.onerror = (event) => {
      const err = new Error(`viseme/worker.js failed to start (${event.message || 'script error'})`);
      reject(err);
      if (options.onError) options.onError(err);
    };
    worker.postMessage({ type: 'load', manifest, baseUrl: String(baseUrl) });
  });
  return engine;
}

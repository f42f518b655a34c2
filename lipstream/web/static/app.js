// The page: wires the controls to a LivePlayer and shows its stats.
import { LivePlayer } from './player.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const token = params.get('token') || undefined;
const player = new LivePlayer($('video'));
window.lipstreamPlayer = player; // for tests and the console

function setStatus(text) { $('status').textContent = text; }

function authHeaders() { return token ? { Authorization: `Bearer ${token}` } : {}; }

async function loadAvatars() {
  const res = await fetch('/api/avatars', { headers: authHeaders() });
  if (!res.ok) { setStatus(`cannot list avatars: HTTP ${res.status}`); return; }
  const { avatars } = await res.json();
  $('avatar').replaceChildren(...avatars.map((a) => new Option(`${a.name} (${a.width}×${a.height})`, a.name)));
  const wanted = params.get('avatar');
  if (wanted) $('avatar').value = wanted;
  if (!avatars.length) setStatus('No avatars yet: run `lipstream avatar sample` first.');
}

function enable(on) {
  for (const id of ['speak', 'interrupt', 'mic', 'file']) $(id).disabled = !on;
}

async function start() {
  const proto = location.protocol === 'https:' ? 'wss' : 'ws';
  const width = params.get('width') ? Number(params.get('width')) : undefined;
  setStatus('connecting…');
  try {
    const ready = await player.connect(`${proto}://${location.host}/ws`, { avatar: $('avatar').value, token, outputWidth: width });
    setStatus(`live: ${ready.avatar} ${ready.width}×${ready.height} ${ready.codec}`);
    enable(true);
  } catch (err) {
    setStatus(`error: ${err.message}`);
    enable(false);
  }
}

function fmt(ms) { return ms == null ? '–' : `${ms.toFixed(0)} ms`; }

player.addEventListener('stats', (e) => {
  const s = e.detail;
  $('s-ttff').textContent = s.ttffMs == null ? '–' : `${fmt(s.ttffMs)} (received ${fmt(s.ttffReceivedMs)})`;
  $('s-fps').textContent = s.fps.toFixed(1);
  $('s-offset').textContent = `${s.avOffsetMs.p50.toFixed(1)} / ${s.avOffsetMs.p95.toFixed(1)} ms`;
  $('s-dropped').textContent = String(s.framesDropped);
  $('s-errors').textContent = String(s.decodeErrors);
  $('s-interrupt').textContent = fmt(s.interruptMs);
});
for (const type of ['speech_started', 'playback_finished']) {
  player.addEventListener(type, (e) => {
    const d = e.detail;
    const li = document.createElement('li');
    li.textContent = `${type} #${d.utterance_id} at ${(d.position_samples / 16000).toFixed(2)} s${d.interrupted ? ' (interrupted)' : ''}`;
    $('events').prepend(li);
  });
}
player.addEventListener('servererror', (e) => setStatus(`server: ${e.detail.message}`));
player.addEventListener('closed', (e) => { setStatus(`session closed (${e.detail.code})`); enable(false); });

$('start').addEventListener('click', start);
$('speak').addEventListener('click', () => player.speak($('text').value));
$('interrupt').addEventListener('click', () => player.interrupt());

async function sendFile(file) {
  if (!file) return;
  setStatus(`uploading ${file.name}…`);
  player.upload(await file.arrayBuffer());
}
$('file').addEventListener('change', (e) => sendFile(e.target.files[0]));
const drop = $('drop');
drop.addEventListener('dragover', (e) => { e.preventDefault(); drop.classList.add('over'); });
drop.addEventListener('dragleave', () => drop.classList.remove('over'));
drop.addEventListener('drop', (e) => { e.preventDefault(); drop.classList.remove('over'); sendFile(e.dataTransfer.files[0]); });

let mic = null;
$('mic').addEventListener('click', async () => {
  if (mic) {
    mic.stream.getTracks().forEach((t) => t.stop());
    mic.node.disconnect();
    mic = null;
    player.flush();
    $('mic').textContent = 'Microphone';
    return;
  }
  const ac = player.ac;
  try {
    const stream = await navigator.mediaDevices.getUserMedia({ audio: { channelCount: 1, echoCancellation: true } });
    await ac.audioWorklet.addModule('/static/mic-worklet.js');
    const node = new AudioWorkletNode(ac, 'mic-tap');
    node.port.onmessage = (e) => {
      const f = e.data;
      const pcm = new Int16Array(f.length);
      for (let i = 0; i < f.length; i += 1) pcm[i] = Math.max(-32768, Math.min(32767, Math.round(f[i] * 32767)));
      player.pushPcm(pcm, ac.sampleRate);
    };
    ac.createMediaStreamSource(stream).connect(node); // not connected to the speakers: no echo
    mic = { stream, node };
    $('mic').textContent = 'Stop microphone';
  } catch (err) {
    setStatus(`microphone unavailable: ${err.message}`);
  }
});

loadAvatars();

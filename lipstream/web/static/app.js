// The page: wires the controls to a LivePlayer and shows its stats; on an agent server, Talk mode too.
import { Microphone, micErrorMessage } from './mic.js';
import { LivePlayer } from './player.js';
import { TalkPanel } from './talk.js';

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
  for (const a of avatars) avatarSizes.set(a.name, [a.width, a.height]);
  const wanted = params.get('avatar');
  if (wanted) $('avatar').value = wanted;
  if (!avatars.length) setStatus('No avatars yet: run `lipstream avatar sample` first.');
  showPoster();
}

const avatarSizes = new Map(); // name -> [width, height]

/** The avatar's idle picture behind the canvas until a session draws on it: the page never opens on a black box. */
function showPoster() {
  const name = $('avatar').value;
  if (!name || live) return;
  const canvas = $('video');
  const size = avatarSizes.get(name);
  if (size) [canvas.width, canvas.height] = size; // also clears what an ended session left drawn
  const query = token ? `?token=${encodeURIComponent(token)}` : '';
  canvas.style.backgroundImage = `url("/api/avatars/${encodeURIComponent(name)}/poster.jpg${query}")`;
  canvas.classList.add('poster');
}

let agent = false; // the server runs `serve --agent` (GET /healthz): sessions ask for a conversation
let live = false;

function enable(on) {
  live = on;
  for (const id of ['speak', 'interrupt', 'mic', 'file']) $(id).disabled = !on;
  talk.setLive(on);
}

/** Open a session; resolves true when it is live. */
async function start() {
  const proto = location.protocol === 'https:' ? 'wss' : 'ws';
  const width = params.get('width') ? Number(params.get('width')) : undefined;
  setStatus('connecting…');
  try {
    // ?stream=full|patch|auto (default auto: the mouth-only patch stream when this browser can composite)
    const stream = params.get('stream') || 'auto';
    // ?audio=opus|pcm|auto (default auto: Opus when WebCodecs decodes it here, protocol 1.3)
    const audio = params.get('audio') || 'auto';
    // ?mic=opus|pcm (default pcm: ?mic=opus sends the microphone as Opus where this browser encodes it, 1.4)
    const mic = params.get('mic') || 'pcm';
    const ready = await player.connect(`${proto}://${location.host}/ws`, { avatar: $('avatar').value, token, outputWidth: width, agent, stream, audio, mic });
    setStatus(`live: ${ready.avatar} ${ready.width}×${ready.height} ${ready.codec}${ready.stream === 'patch' ? ' · patch stream' : ''}${ready.audio_codec === 'opus' ? ' · opus audio' : ''}${ready.agent ? ' · talk mode' : ''}`);
    if (agent && !ready.agent) showTalk(false); // the server said no after all: a plain session
    enable(true);
    return true;
  } catch (err) {
    setStatus(`error: ${err.message}`);
    enable(false);
    return false;
  }
}

const talk = new TalkPanel(player, $, () => (live ? Promise.resolve(true) : start()));

/** Talk mode replaces the plain Microphone button: in an agent session `pcm` is the user's voice, not speech. */
function showTalk(on) {
  talk.show(on);
  $('mic').hidden = on;
}

async function detectAgent() {
  try {
    const res = await fetch('/healthz');
    const health = res.ok ? await res.json() : {};
    agent = health.agent === true;
    if (health.persona) showPersona(health.persona);
  } catch { agent = false; }
  showTalk(agent);
  if (agent) setStatus('Pick an avatar and press Talk to have a conversation.');
}

/** The persona's name over the avatar; its greeting is captioned when a Talk session starts. */
function showPersona(persona) {
  $('persona').textContent = persona.name;
  $('persona').hidden = false;
  document.title = `${persona.name} · lipstream`;
  talk.setPersona(persona);
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
// patch mode: the base loop could not be loaded; the player reopens the session with full frames
player.addEventListener('basefailed', (e) => setStatus(e.detail.message));
player.addEventListener('fellback', (e) => {
  const { ready, message } = e.detail;
  setStatus(`${message} — live: ${ready.avatar} ${ready.width}×${ready.height} (full frames)`);
  enable(true);
});
player.addEventListener('closed', (e) => {
  if (!e.detail.reconnecting) setStatus(`session closed (${e.detail.code})`);
  enable(false);
});
// the server (a replica behind Ray Serve) went away: the player opens a new session by itself
player.addEventListener('reconnecting', (e) => {
  const { code, attempt, delayMs } = e.detail;
  setStatus(`connection lost (${code}: server or replica gone); reconnecting in ${(delayMs / 1000).toFixed(1)} s (try ${attempt})…`);
});
player.addEventListener('reconnected', (e) => {
  const { ready } = e.detail;
  setStatus(`reconnected: new session on ${ready.avatar}${ready.replica ? ` (replica ${ready.replica})` : ''} — ${ready.width}×${ready.height}`);
  enable(true);
});
player.addEventListener('reconnect_failed', (e) => setStatus(`connection lost (${e.detail.code}); could not reconnect after ${e.detail.attempts} tries: press Start`));
window.lipstreamTalk = talk; // for tests and the console

$('start').addEventListener('click', start);
$('avatar').addEventListener('change', showPoster);
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

// Plain session: the microphone is lip-synced live (one utterance until pressed again).
let mic = null;
$('mic').addEventListener('click', async () => {
  if (mic) {
    mic.stop();
    mic = null;
    player.flush();
    $('mic').textContent = 'Microphone';
    return;
  }
  const m = new Microphone(player.ac, (pcm, rate) => player.pushPcm(pcm, rate));
  try {
    await m.start({ channelCount: 1, echoCancellation: true });
    mic = m;
    $('mic').textContent = 'Stop microphone';
  } catch (err) {
    setStatus(micErrorMessage(err));
  }
});

detectAgent().then(loadAvatars); // avatars second: their status line (none yet?) wins

// Talk mode (protocol 1.1): the microphone goes to the agent; the user's words, the avatar's captions and a turn log
// are shown. Captions ride the player's audio-clock events (reply_text fires when its position is heard).
import { Microphone, micErrorMessage } from './mic.js';

const BARGE_IN_WINDOW_MS = 1500; // after a barge-in onset, how long to wait before reading the last speech frame
const CAPTION_LINGER_MS = 1200;

/** Format milliseconds for the turn log. */
function ms(v) { return v == null ? '–' : `${Math.round(v)}`; }

// A turn's stages as the server reports them (ms after the end of the user's speech), in order, with
// the colour of each one's bar in the waterfall
const STAGES = [
  ['transcript', 'transcript', '#5b8def'], ['decision', 'end of turn decided', '#9b6bd6'],
  ['llm_first_token', 'first token', '#e0a83a'], ['first_phrase', 'first phrase', '#d9773b'],
  ['first_audio', 'first audio', '#4fb37a'], ['first_frame', 'first frame', '#e05a5a'],
];
const WATERFALL_MS = 1500; // the waterfall's full width

// One bar a stage, from the previous stage's end to its own: where the time of a turn goes, at a glance
function waterfall(m) {
  const box = document.createElement('div');
  box.className = 'waterfall';
  let prev = 0;
  for (const [key, label, colour] of STAGES) {
    const at = m[key];
    if (at == null) continue;
    const bar = document.createElement('span');
    const from = Math.max(0, Math.min(prev, at));
    bar.style.left = `${(100 * Math.min(from, WATERFALL_MS)) / WATERFALL_MS}%`;
    bar.style.width = `${Math.max(0.5, (100 * (Math.min(at, WATERFALL_MS) - Math.min(from, WATERFALL_MS))) / WATERFALL_MS)}%`;
    bar.style.background = colour;
    bar.title = `${label}: ${Math.round(at)} ms`;
    bar.dataset.stage = key;
    box.append(bar);
    prev = Math.max(prev, at);
  }
  return box;
}

export class TalkPanel {
  /**
   * @param {import('./player.js').LivePlayer} player the session's player
   * @param {(id: string) => HTMLElement} $ element lookup
   * @param {() => Promise<boolean>} connect opens an agent session when none is open; resolves true when live
   */
  constructor(player, $, connect) {
    this.player = player;
    this.$ = $;
    this.connect = connect;
    this.mic = null;
    this.turns = new Map(); // turn -> {user: li, avatar: li, row: tr}
    this.bargeIns = []; // {turn, onsetAt, ms}
    this._cuts = []; // {at, lastShown}: when interrupted answers' cuts reached the screen, their last frames
    this._captionTimer = null;
    $('talk-btn').addEventListener('click', () => this.toggle());
    $('stop').addEventListener('click', () => this.stopAnswer());
    this._listen();
  }

  /** Show or hide the whole panel (agent servers only) and the caption strip. */
  show(on) {
    this.$('talk').hidden = !on;
    this.$('caption').hidden = !on;
  }

  /** Talk: connect if needed, then open the microphone; pressed again, release it. */
  async toggle() {
    if (this.mic && this.mic.active) { this.stopMic(); return; }
    const btn = this.$('talk-btn');
    btn.disabled = true;
    this._notice(null);
    try {
      if (!(await this.connect())) return;
      // The player's context: it is already running (created in the click that connected), and its rate is sent.
      const mic = new Microphone(this.player.ac, (pcm, rate) => {
        this.player.pushMic(pcm, rate);
        this._level(mic.log[mic.log.length - 1].peak);
      });
      await mic.start();
      this.mic = mic;
      window.lipstreamMic = mic; // for tests and the console
      btn.textContent = 'Mute';
      btn.classList.add('live');
      this._state('listening');
    } catch (err) {
      this._notice(micErrorMessage(err));
      this._state('microphone off');
    } finally {
      btn.disabled = false;
    }
  }

  /** Release the microphone (the server just hears no more audio; the turn in progress ends by silence). */
  stopMic() {
    if (this.mic) this.mic.stop();
    this.mic = null;
    this.$('talk-btn').textContent = 'Talk';
    this.$('talk-btn').classList.remove('live');
    this._level(0);
    this._state('microphone off');
  }

  /** Stop button: the avatar stops now and the answer being written is dropped (server side). */
  stopAnswer() {
    this.player.interrupt();
    this._caption('');
  }

  /** Session state after connect/close: Stop works only on a live session. */
  /** The server's persona ({name, greeting}): its greeting is spoken first in each Talk session. */
  setPersona(persona) { this.persona = persona; }

  setLive(on) {
    this.$('stop').disabled = !on;
    this._greeting = on && this.persona && this.persona.greeting ? this.persona.greeting : null;
    if (!on) this.stopMic();
    else if (this.mic) this.mic.restartCount(); // a new session counts `mic_samples` from its own first pcm
  }

  _listen() {
    const p = this.player;
    p.addEventListener('state', (e) => this._onStates(e.detail));
    p.addEventListener('user_speech_started', (e) => this._onUserStarted(e.detail));
    p.addEventListener('user_speech_ended', () => this._state('your turn is over · thinking…'));
    p.addEventListener('turn_decision', (e) => this._onDecision(e.detail));
    p.addEventListener('transcript', (e) => this._onTranscript(e.detail));
    p.addEventListener('reply_text', (e) => this._onReply(e.detail));
    p.addEventListener('turn_metrics', (e) => this._onMetrics(e.detail));
    p.addEventListener('speech_started', () => {
      if (this._greeting) {
        this._state('answering');
        this._logLine('avatar', this._greeting); this._caption(this._greeting); this._greeting = null;
      } else if (this._waitLine) { this._state('asking you to wait'); this._caption(this._waitLine); }
      else this._state('answering');
    });
    p.addEventListener('playback_finished', (e) => {
      if (e.detail.interrupted) {
        this._cuts = [...this._cuts.slice(-7), { at: performance.now(), lastShown: this.player.stats.lastSpeechShownAt }];
        this._caption('');
        this._markInterrupted();
      } else this._caption(null, CAPTION_LINGER_MS);
      this._state(this.mic && this.mic.active ? 'listening' : 'microphone off');
    });
    p.addEventListener('servererror', (e) => {
      if (e.detail.code === 'llm') this._logLine('error', `language model: ${e.detail.message}`);
    });
  }

  /** The turn's rows, made on first mention (a transcript can come before user_speech_started's row exists). */
  _turn(id) {
    let t = this.turns.get(id);
    if (!t) {
      const user = document.createElement('li');
      user.className = 'user partial';
      user.textContent = '…';
      this.$('conversation').append(user);
      t = { user, avatar: null, row: null };
      this.turns.set(id, t);
    }
    return t;
  }

  _onUserStarted(d) {
    this._turn(d.turn);
    this._state('you are speaking');
    const onsetAt = this.mic ? this.mic.wallTimeOf(d.mic_samples) : null;
    if (onsetAt == null) return;
    // Barge-in latency, measured like the Stop button's: onset of the user's speech -> last speech frame on screen.
    // It only counts when the avatar was still showing speech after the user began.
    setTimeout(() => {
      // the answer spoken over ends where its cut (the first after the onset) reached the screen: by the end of
      // the window the answer to what the user said may be playing already, or even cut in turn when they went
      // on after a pause, and its frames are not the old answer's
      const cut = this._cuts.find((c) => c.at >= onsetAt);
      const last = cut ? cut.lastShown : this.player.stats.lastSpeechShownAt;
      if (last == null || last < onsetAt) return;
      const entry = { turn: d.turn, onsetAt, ms: last - onsetAt };
      this.bargeIns.push(entry);
      this._metricsRow(d.turn).cells[5].textContent = `barge-in ${ms(entry.ms)} ms`;
    }, BARGE_IN_WINDOW_MS);
  }

  /** The end-of-turn detector judged a pause: finished (the answer comes), or not yet (it keeps listening). */
  _onDecision(d) {
    this._state(d.finished ? 'your turn is over' : 'listening… (go on)');
    this.$('mic-state').title = `${d.detector} end-of-turn score ${d.score}`;
  }

  _onTranscript(d) {
    const { user } = this._turn(d.turn);
    const partial = d.kind !== 'final';
    user.classList.toggle('partial', partial);
    user.classList.toggle('empty', !partial && !d.text.trim());
    user.textContent = d.text.trim() || (partial ? '…' : '(nothing heard)');
    this._scroll();
  }

  _onReply(d) {
    const t = this._turn(d.turn);
    if (!t.avatar) {
      t.avatar = document.createElement('li');
      t.avatar.className = 'avatar';
      t.user.after(t.avatar);
    }
    t.avatar.textContent = `${t.avatar.textContent} ${d.text}`.trim();
    this._caption(d.text);
    this._sources(d.sources || []);
    if (d.sources && d.sources.length) t.avatar.title = `from ${d.sources.join(', ')}`;
    this._scroll();
  }

  _markInterrupted() {
    const last = [...this.turns.values()].reverse().find((t) => t.avatar);
    if (last && !last.avatar.classList.contains('interrupted')) last.avatar.classList.add('interrupted');
  }

  _onMetrics(d) {
    const row = this._metricsRow(d.turn);
    const m = d.ms || {};
    [m.transcript, m.llm_first_token, m.first_audio, m.first_frame].forEach((v, i) => { row.cells[i + 1].textContent = ms(v); });
    if (d.interrupted && !row.cells[5].textContent) row.cells[5].textContent = 'interrupted';
    row.cells[6].replaceChildren(waterfall(m));
    // what ended the user's turn: the detector, its hard cap, the silence rule or the turn's length limit
    if (d.end_rule) row.cells[0].textContent = `${d.turn} · ${d.end_rule.replace('_', ' ')}`;
  }

  _metricsRow(turn) {
    const t = this._turn(turn);
    if (!t.row) {
      t.row = this.$('turns').tBodies[0].insertRow(0);
      for (let i = 0; i < 7; i += 1) t.row.insertCell();
      t.row.cells[0].textContent = String(turn);
    }
    return t.row;
  }

  _logLine(cls, text) {
    const li = document.createElement('li');
    li.className = cls;
    li.textContent = text;
    this.$('conversation').append(li);
    this._scroll();
  }

  /** Caption strip: `text` shows now; null keeps the current one and clears it after `lingerMs`. */
  _caption(text, lingerMs = 0) {
    const el = this.$('caption');
    clearTimeout(this._captionTimer);
    if (text != null) el.textContent = text;
    if (lingerMs) this._captionTimer = setTimeout(() => { el.textContent = ''; this._sources([]); }, lingerMs);
    el.classList.toggle('on', el.textContent !== '');
    if (el.textContent === '') this._sources([]);
  }

  /** The documents the caption's answer came from, under it (none: hidden). */
  _sources(names) {
    const el = this.$('caption-sources');
    el.textContent = names.length ? `from ${names.join(', ')}` : '';
    el.hidden = !names.length;
  }

  _state(text) { this.$('mic-state').textContent = text; }

  /** The server's turn machine: the avatar's state (listening, thinking, speaking) and the user's. */
  _onStates(d) {
    const el = this.$('states');
    el.dataset.agent = d.agent;
    this._waitLine = d.agent === 'waiting' ? d.wait_line : null; // the speech that plays in line is this line
    el.dataset.user = d.user;
    // in line for a seat (every conversation of the server taken): say so plainly, with the place in line
    el.textContent = d.agent === 'waiting'
      ? `the avatar is with another visitor · you are number ${d.queue_position} in line · you ${d.user}`
      : `avatar ${d.agent} · you ${d.user}`;
  }

  _level(peak) { this.$('mic-level').value = peak; }

  _notice(text) {
    const el = this.$('mic-error');
    el.hidden = !text;
    el.textContent = text || '';
  }

  _scroll() { const c = this.$('conversation'); c.scrollTop = c.scrollHeight; }
}

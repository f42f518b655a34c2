// Where a speech start's time goes in the page: ms from the request (speak, upload, first pushed chunk) to its
// first speech frame received, its first speech audio received, decoded, scheduled on the audio clock (and the
// clock time it was scheduled for: `due`), and shown. The player fills it; benchmarks read stats.firstSpeech.

export class FirstSpeech {
  constructor() {
    this.start = null;
    this.marks = {};
  }

  /** A new request at `at` (performance.now()): forget the last one's marks. */
  begin(at) {
    this.start = at;
    this.marks = {};
  }

  /** The first time `name` happens for this request (at `at`, default now). */
  mark(name, at = performance.now()) {
    if (this.start == null || this.marks[name] != null) return;
    this.marks[name] = Math.round((at - this.start) * 10) / 10;
  }

  /** Whether `name` was marked already. */
  has(name) { return this.marks[name] != null; }
}

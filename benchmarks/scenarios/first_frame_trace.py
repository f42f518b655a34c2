"""`lipstream serve` with per-stage marks of each speak request's way to its first speech frame (issue 48).

Run by `first_frame.py --stages` instead of `python -m lipstream serve`: it wraps a few functions of the
server (nothing in lipstream changes) and appends one JSON line per utterance to $FIRST_FRAME_TRACE: ms from
the speak message's arrival to the text cut, the first phrase synthesised, its features, the producer taking
it, the first frames made (and the part of that spent in the encoder), and the first speech frame handed to
the socket; `lead_ms`: how far ahead of the player's clock that frame's pts was when the producer took it.

    FIRST_FRAME_TRACE=/tmp/trace.jsonl python benchmarks/scenarios/first_frame_trace.py serve --port 0 ...
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from pathlib import Path


class Trace:
    """Marks of the utterance in flight (one speak at a time, as the benchmark sends them)."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.lock = threading.Lock()
        self.marks: dict[str, float] = {}
        self.extra: dict[str, float] = {}
        self.t0: float | None = None
        self.encode_ms = 0.0  # encoder time since the producer took the first phrase

    def begin(self) -> None:
        """A speak message arrived."""
        with self.lock:
            self.t0, self.marks, self.extra = time.perf_counter(), {}, {}

    def mark(self, name: str) -> None:
        """The first time `name` happens since the speak message."""
        with self.lock:
            if self.t0 is not None and name not in self.marks:
                self.marks[name] = round((time.perf_counter() - self.t0) * 1000.0, 1)

    def note(self, name: str, value: float) -> None:
        """A figure of this utterance (kept once)."""
        with self.lock:
            if self.t0 is not None:
                self.extra.setdefault(name, round(value, 1))

    def end(self) -> None:
        """The first speech frame went out: write the line."""
        with self.lock:
            if self.t0 is None:
                return
            line = {**self.marks, **self.extra}
            self.t0 = None
        with self.out.open("a") as fh:
            fh.write(json.dumps(line) + "\n")


def install(trace: Trace) -> None:
    """Wrap the server's functions on the first frame's way."""
    from lipstream.media.h264 import H264StreamEncoder
    from lipstream.render import session as render_session
    from lipstream.render.utterance import Utterance
    from lipstream.server import connection
    from lipstream.talk.voices import speaker

    queue_speak = connection.Connection._queue_speak

    def _queue_speak(self, message):
        trace.begin()
        return queue_speak(self, message)

    connection.Connection._queue_speak = _queue_speak

    split = speaker.split_first_phrase

    def split_first_phrase(text):
        pieces = split(text)
        trace.mark("cut")
        trace.note("first_words", len(pieces[0].split()))
        return pieces

    speaker.split_first_phrase = split_first_phrase

    sentences = speaker.Speaker._sentences

    async def _sentences(self, *args, **kwargs):
        async for speech in sentences(self, *args, **kwargs):
            trace.mark("synthesised")
            trace.note("first_audio_ms", len(speech.pcm) / 16.0)
            yield speech

    speaker.Speaker._sentences = _sentences

    append = Utterance.append_segment

    def append_segment(self, pcm, feats, *args, **kwargs):
        if self.kind == "text":
            trace.mark("features")
        return append(self, pcm, feats, *args, **kwargs)

    Utterance.append_segment = append_segment

    emit = render_session.RenderSession._emit_speech

    async def _emit_speech(self, utt, count):
        if not utt.started:
            trace.mark("taken")
            position = self._clock.position_frames(time.perf_counter())
            trace.note("lead_ms", (self._tick - position) * 40.0)
            trace.encode_ms = 0.0
        return await emit(self, utt, count)

    render_session.RenderSession._emit_speech = _emit_speech

    released = render_session.RenderSession._emit_released

    async def _emit_released(self, utt, items, generation, final, marks=None):
        if not utt.started and items:
            trace.mark("made")
            trace.note("encode_ms", trace.encode_ms)
        return await released(self, utt, items, generation, final, marks)

    render_session.RenderSession._emit_released = _emit_released

    encode = H264StreamEncoder.encode

    @functools.wraps(encode)
    def timed_encode(self, *args, **kwargs):
        started = time.perf_counter()
        unit = encode(self, *args, **kwargs)
        trace.encode_ms += (time.perf_counter() - started) * 1000.0
        if unit is not None and unit.keyframe:
            trace.note("first_key_bytes", len(unit.data))
        return unit

    H264StreamEncoder.encode = timed_encode

    frame_messages = connection.frame_messages

    def messages(item, **kwargs):
        if item.speaking:
            trace.mark("sent")
            trace.end()
        return frame_messages(item, **kwargs)

    connection.frame_messages = messages


def main() -> int:
    """Install the trace, then run the CLI with the arguments given."""
    import sys

    from lipstream.cli import main as cli_main

    install(Trace(Path(os.environ["FIRST_FRAME_TRACE"])))
    return cli_main(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())

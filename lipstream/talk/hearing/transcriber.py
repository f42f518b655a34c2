"""Recognition that keeps up while the user speaks: in a long turn stable words are committed as they come,
so the turn's final transcript decodes only its last moments.

A turn under `WHOLE_TURN_SECONDS` (a question) is decoded whole every time: cheaper and truer than a tail
(see the constant). Past that, each partial decode reads the audio from the last committed word on (with the
committed text as Whisper's prompt) and returns word timings. A word is committed once two decodes in a row
agree on it (local agreement) and it ended at least `hold_seconds` before the audio did; the next decode
starts at the end of the last committed word. At the end of the turn only that tail is decoded. A recogniser
that gives no word timings (a user's endpoint) decodes the whole turn as before.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace

import numpy as np

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.errors import LipstreamError
from lipstream.talk.hearing.mic_buffer import MicBuffer
from lipstream.talk.hearing.stt import SpeechToText, Transcript, WordTimingSpeechToText
from lipstream.talk.text import bare_word

PROMPT_CHARS = 200  # the committed text handed to Whisper as its prompt: the last words are enough context
OVERLAP_SECONDS = 0.2  # audio before the last committed word's end that a decode re-reads (word ends drift)
# nothing is committed until the turn is this long: up to here every decode reads the whole turn. Measured
# (`python -m benchmarks stt_streaming`: Whisper tiny.en, one thread, AMD EPYC, 60 questions x 4 partial
# schedules): the final decode read whole took 110 ms p50 at WER 0.185, a prompted tail after words
# committed from the start 549 ms (a prompt takes the 30 s window) at WER 0.364; a tail cut after "Can I"
# read "borrow a bicycle" as "Myroma is equal". A whole 12 s turn still decodes in ~400 ms, under a
# prompted 1 s tail's 520 ms.
WHOLE_TURN_SECONDS = 12.0


@dataclass(frozen=True)
class TimedWord:
    """A recognised word as Whisper wrote it (leading space and punctuation kept), at stream samples."""

    text: str
    start: int
    end: int

    @property
    def key(self) -> str:
        """The word for comparison."""
        return bare_word(self.text)


@dataclass
class StreamingTranscript:
    """One turn's transcript while it is spoken: what is committed, and where the undecided tail starts."""

    turn_start: int  # stream sample where the turn's audio (its preroll included) starts
    hold_seconds: float = 0.5  # a word this close to the end of the audio is never committed yet
    whole_turn_seconds: float = WHOLE_TURN_SECONDS  # a turn shorter than this commits nothing
    committed: list[TimedWord] = field(default_factory=list)
    _pending: list[TimedWord] = field(default_factory=list)  # the last decode's words after the committed

    @property
    def tail_start(self) -> int:
        """Stream sample from which audio is still undecided (the next decode starts a little before)."""
        if not self.committed:
            return self.turn_start
        return max(self.turn_start, self.committed[-1].end - int(OVERLAP_SECONDS * SAMPLE_RATE))

    @property
    def committed_text(self) -> str:
        """The committed words as one string."""
        return "".join(w.text for w in self.committed).strip()

    @property
    def prompt(self) -> str:
        """What the next decode is primed with: the end of the committed text."""
        return self.committed_text[-PROMPT_CHARS:]

    def new_words(self, words: list[TimedWord]) -> list[TimedWord]:
        """A decode's words that follow the committed ones: re-read words before the last committed end,
        and a repeat of the last committed words at the start, are dropped."""
        if not self.committed:
            return list(words)
        last_end = self.committed[-1].end
        fresh = [w for w in words if w.end > last_end]
        keys = [w.key for w in self.committed[-3:]]
        for n in range(min(3, len(fresh)), 0, -1):  # "... the library" + "library opens" -> "opens"
            if [w.key for w in fresh[:n]] == keys[-n:]:
                return fresh[n:]
        return fresh

    def update(self, words: list[TimedWord], audio_end: int) -> str:
        """Take a partial decode's words (audio up to `audio_end`): commit what two decodes agree on and
        what ended `hold_seconds` before the audio did; return the partial text (committed + the rest)."""
        fresh = self.new_words(words)
        hold = audio_end - int(self.hold_seconds * SAMPLE_RATE)
        if audio_end - self.turn_start < self.whole_turn_seconds * SAMPLE_RATE:
            hold = -1  # a short turn: the next decode reads it whole again
        agreed = 0
        for new, old in zip(fresh, self._pending, strict=False):
            if new.key != old.key or not new.key or new.end > hold:
                break
            agreed += 1
        self.committed.extend(fresh[:agreed])
        self._pending = fresh[agreed:]
        return (self.committed_text + "".join(w.text for w in self._pending)).strip()

    def finish(self, tail: list[TimedWord] | str) -> str:
        """The final transcript: the committed words and the tail's decode (words, or plain text)."""
        if isinstance(tail, str):
            rest = tail.strip()
            done = self.committed_text
            return f"{done} {rest}".strip() if done else rest
        return (self.committed_text + "".join(w.text for w in self.new_words(tail))).strip()


class TurnRecogniser:
    """Decodes one turn with a recogniser: partials commit stable words, the final decodes the tail."""

    def __init__(
        self, partial_stt: SpeechToText, final_stt: SpeechToText, turn_start: int, hold_seconds: float = 0.5,
        streaming: bool = True, whole_turn_seconds: float = WHOLE_TURN_SECONDS,
    ) -> None:
        """`partial_stt` decodes while the user speaks, `final_stt` the tail at the end (both may be one);
        `turn_start`: the stream sample where the turn's audio, its preroll included, starts; `streaming`
        False: whole-turn decodes; `whole_turn_seconds`: a streaming turn commits nothing until this long."""
        self.partial_stt = partial_stt
        self.final_stt = final_stt
        # word timings from both, or whole-turn decodes as before (a user's recogniser may give none)
        timed = all(isinstance(s, WordTimingSpeechToText) for s in (partial_stt, final_stt))
        self.words = streaming and timed
        self.state = StreamingTranscript(turn_start, hold_seconds, whole_turn_seconds)

    def audio_from(self, state: StreamingTranscript | None = None) -> int:
        """Stream sample where the next decode's audio should start (after `state`'s commitments, default
        the live ones)."""
        state = state or self.state
        return state.tail_start if self.words else state.turn_start

    def partial(self, audio: np.ndarray, audio_start: int) -> str:
        """Blocking: decode the audio from `audio_from()` on, commit what is stable; the partial text."""
        if not self.words:
            return self.partial_stt.transcribe(audio).text.strip()
        assert isinstance(self.partial_stt, WordTimingSpeechToText)
        result = self.partial_stt.transcribe_words(audio, self.state.prompt)
        if result.text and not result.words:  # a server that gave text only: shown, nothing committed
            return self.state.finish(result.text)
        return self.state.update(_timed(result, audio_start), audio_start + len(audio))

    def final(self, audio: np.ndarray, audio_start: int, state: StreamingTranscript | None = None) -> str:
        """Blocking: the whole turn's transcript, decoding only the audio from `audio_from()` on. `state`: the
        commitments to finish from (a snapshot taken when the audio was cut; default the live state)."""
        if not self.words:
            return self.whole(audio)
        assert isinstance(self.final_stt, WordTimingSpeechToText)
        state = state or self.state
        result = self.final_stt.transcribe_words(audio, state.prompt)
        text = state.finish(_timed(result, audio_start) if result.words else result.text)
        if state.committed and text == state.committed_text and len(audio) >= SAMPLE_RATE // 2:
            # the prompted tail read nothing new (Whisper may take the prompt for the whole utterance): the
            # tail again without the prompt
            text = state.finish(self.final_stt.transcribe(audio).text)
        return text

    def whole(self, audio: np.ndarray) -> str:
        """Blocking: the whole turn decoded at once, unprompted (the fallback when a tail reads nothing)."""
        return self.final_stt.transcribe(audio).text.strip()

    def snapshot(self) -> StreamingTranscript:
        """The commitments as they are now: a final decode finishes from these, while a partial decode on
        another thread may still add to the live state."""
        return replace(self.state, committed=list(self.state.committed), _pending=list(self.state._pending))


def _timed(result: Transcript, audio_start: int) -> list[TimedWord]:
    """A transcript's word timings (seconds into its audio) as stream samples."""
    return [
        TimedWord(text, audio_start + int(start * SAMPLE_RATE), audio_start + int(end * SAMPLE_RATE))
        for text, start, end in result.words
    ]


class FinalsInFlight:
    """The final transcripts being decoded now by a server's conversations, which share one recogniser: a
    final is on its turn's answer's critical path, a partial is not, so no conversation starts a partial
    decode while any final is in flight (issue 49: work in order of need)."""

    def __init__(self) -> None:
        self.count = 0

    @property
    def busy(self) -> bool:
        """A final transcript is being decoded."""
        return self.count > 0


class LiveTranscription:
    """One turn's recognition on the recogniser's threads: a partial decode now and then while the user
    speaks (one at a time), and the final transcript at a pause or the end."""

    def __init__(
        self, recog: TurnRecogniser, executor: Executor, every_seconds: float, start: int,
        finals: FinalsInFlight | None = None,
    ) -> None:
        """`every_seconds`: the least audio between two partial decodes; `start`: the turn's first sample;
        `finals`: the final decodes of every conversation sharing the recogniser (partials wait for them)."""
        self.finals = finals or FinalsInFlight()
        self.recog = recog
        self.executor = executor
        self.every_seconds = every_seconds
        self.upto = start  # the mic sample the last partial decode's audio ends at
        self.decode: asyncio.Task | None = None  # the last decode started (its result: the text)
        self.decode_is_final = False  # that decode runs on the final recogniser (`start_final`)
        self.seconds = 0.0  # how long the last partial decode took

    def restart(self, sample: int) -> None:
        """The turn goes on (joined) from `sample`: partial decodes start again from there."""
        self.upto = sample
        self.decode = None
        self.decode_is_final = False

    def due(self, mic_end: int) -> bool:
        """Time for a partial decode: none in flight, and enough new audio (never more often than 1.5x
        what a decode takes, so the recogniser stays free for the final transcript)."""
        if (self.decode is not None and not self.decode.done()) or self.finals.busy:
            return False
        every = max(self.every_seconds, 1.5 * self.seconds)
        return mic_end - self.upto >= every * SAMPLE_RATE

    def start_partial(self, mic: MicBuffer) -> asyncio.Task:
        """Decode the undecided tail of the turn heard so far; the task's result is the partial text."""
        self.upto = mic.end
        start = self.recog.audio_from()
        self.decode = asyncio.create_task(self._partial(mic.slice(start), start))
        self.decode_is_final = False
        return self.decode

    def covers(self, sample: int) -> bool:
        """A decode reading the audio up to `sample` (or further) has started."""
        return self.decode is not None and self.upto >= sample

    def final_in_flight(self) -> bool:
        """A final decode started early (`start_final`) is still running."""
        return self.decode_is_final and self.decode is not None and not self.decode.done()

    def start_final(self, mic: MicBuffer) -> asyncio.Task:
        """A silence began: decode the turn heard so far on the final recogniser now, before the pause is
        confirmed (~64 ms later), rather than a partial decode on the partial one; the pause's transcript
        reuses it (`final`), and a user who goes on costs one decode. The task's result is the text."""
        self.upto = end = mic.end
        self.decode = asyncio.create_task(self._decode_final(mic, end))
        self.decode_is_final = True
        return self.decode

    async def _partial(self, audio: np.ndarray, start: int) -> str:
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        text = await loop.run_in_executor(self.executor, self.recog.partial, audio, start)
        self.seconds = time.perf_counter() - started
        return text

    async def final(self, mic: MicBuffer, end_sample: int) -> str:
        """The turn's transcript up to `end_sample`: a decode started in the silence after the last word
        already holds it all (awaited, not decoded twice); else the tail after the committed words is
        decoded now, on the final recogniser, beside any partial decode still running."""
        if self.covers(end_sample):
            assert self.decode is not None
            try:
                return await asyncio.shield(self.decode)
            except (asyncio.CancelledError, LipstreamError):
                pass  # decode it again below
        return await self._decode_final(mic, end_sample)

    async def _decode_final(self, mic: MicBuffer, end_sample: int) -> str:
        """Decode the turn up to `end_sample` on the final recogniser (the tail after the committed words)."""
        state = self.recog.snapshot()
        start = self.recog.audio_from(state)
        audio = mic.slice(start, end_sample)
        if audio.size < SAMPLE_RATE // 10 and not state.committed:
            return ""
        loop = asyncio.get_running_loop()
        self.finals.count += 1
        try:
            text = await loop.run_in_executor(self.executor, self.recog.final, audio, start, state)
            if state.committed and text == state.committed_text and audio.size >= SAMPLE_RATE // 2:
                # a prompted decode of the tail read nothing (Whisper sometimes takes the prompt as the whole
                # answer): the whole turn, unprompted, rather than losing its last words
                whole = mic.slice(state.turn_start, end_sample)
                text = await loop.run_in_executor(self.executor, self.recog.whole, whole)
        finally:
            self.finals.count -= 1
        return text

    def cancel(self) -> None:
        """Stop waiting for a partial decode (the thread finishes it; its result is not used)."""
        if self.decode is not None and not self.decode.done():
            self.decode.cancel()

"""The conversation loop over a Session: the user's microphone in, the avatar's spoken answers out.

mic PCM -> (echo cancelled) -> VAD -> STT (partials while the user speaks, the final at the end of the
turn) -> language model (streamed) -> sentences -> TTS -> Session. When the user starts speaking while
the avatar talks, the answer is cut (barge-in) and the history keeps only what was heard.

The microphone is analysed (echo cancellation, VAD) on a thread of its own, transcription on the
recogniser threads, sentences are spoken through the injected Speaker; the language model streams from its
own worker. Events for the client are handed to the injected `emit` coroutine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lipstream.audio.decode import StreamResampler, to_float32
from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.errors import LipstreamError
from lipstream.talk.conversation_types import ConversationConfig, Emit, TurnTimes
from lipstream.talk.echo_gate import EchoGate
from lipstream.talk.llm import ChatMessage, LanguageModel, LLMError, as_spoken
from lipstream.talk.mic_buffer import MicBuffer
from lipstream.talk.sentences import SentenceStream, speakable
from lipstream.talk.session_port import AvatarSession
from lipstream.talk.speaker import Speaker
from lipstream.talk.stt import SpeechToText
from lipstream.talk.turn_end import TurnDetector, TurnRule
from lipstream.talk.vad import VadEvent, VoiceActivityDetector
from lipstream.threads import background_pool

log = logging.getLogger(__name__)

_END = object()  # end of a model's reply in a _Prepared queue
TURN_AUDIO_SAMPLES = 8 * SAMPLE_RATE  # what an audio turn detector hears: the last 8 s


@dataclass(frozen=True)
class _EndedTurn:
    """The last turn that ended: a continuation that starts soon after joins it."""

    turn: int
    start: int  # stream samples
    end: int


@dataclass
class _Prepared:
    """An answer being prepared for the turn that ends at `end_sample`: its transcript, then the model's
    reply streaming into `deltas`. Started at a pause (before the end of the turn is confirmed) it hides
    speech recognition and the model's first tokens inside the end-of-turn silence; dropped if the user
    goes on speaking."""

    end_sample: int
    deltas: asyncio.Queue = field(default_factory=asyncio.Queue)  # str, then _END or an LLMError
    task: asyncio.Task | None = None  # transcribes, then starts `feeder`; its result is the transcript
    feeder: asyncio.Task | None = None
    first_token_at: float | None = None
    transcript_at: float | None = None  # when the transcript was ready (often before the turn is decided)
    error: LLMError | None = None  # the model failed while writing this answer
    error_reported: bool = False  # ... and the client was told (an `error` event)
    score: float | None = None  # the turn detector's judgement of this pause (None: not judged)
    created_at: float = field(default_factory=time.perf_counter)
    tokens: int = 0  # text deltas the model wrote for it (wasted when it is dropped)

    def cancel(self) -> None:
        """Drop it (the user went on, or the answer was interrupted)."""
        for task in (self.task, self.feeder):
            if task is not None and not task.done():
                task.cancel()


class Conversation:
    """One user talking with the avatar of one Session (Pipecat or LiveKit users would wrap this)."""

    def __init__(
        self,
        session: AvatarSession,
        stt: SpeechToText,
        llm: LanguageModel,
        emit: Emit,
        config: ConversationConfig | None = None,
        *,
        vad: VoiceActivityDetector | None = None,
        echo: Any = None,
        partial_stt: SpeechToText | None = None,
        speaker: Speaker | None = None,
        recogniser: Executor | None = None,
        detector: TurnDetector | None = None,
    ) -> None:
        """`session`: a started lipstream Session; `emit`: sends an event dict to the client; `echo`: an
        echo canceller fed with what the avatar plays (None: the microphone is used as it comes);
        `partial_stt`: the recogniser for partial transcripts (default `stt`), so a final transcript, on the
        critical path, never shares its model with them; `speaker`: the voices answers are spoken with (a
        server's, shared); `recogniser`: the threads transcription runs on (default: two of its own, one for
        the final transcript while a partial one runs); `detector`: judges each pause when the config's
        turn rule uses one (`config.turn`)."""
        self.session = session
        self.speaker = speaker or Speaker()
        self._own_recogniser = recogniser is None
        self.recogniser = recogniser or background_pool(2, "lipstream-stt")
        self.stt = stt
        self.partial_stt = partial_stt or stt
        self.llm = llm
        self.emit = emit
        self.config = config or ConversationConfig()
        if self.config.turn.uses_detector and detector is None:
            raise ValueError(f"the {self.config.turn.detector!r} turn rule needs a detector")
        self.detector = detector if self.config.turn.uses_detector else None
        self.vad = vad or VoiceActivityDetector(
            start_ms=self.config.start_ms, end_silence_ms=self.config.vad_end_silence_ms,
            pause_ms=self.config.pause_ms,
        )
        self.echo = echo
        self.history: deque[ChatMessage] = deque(maxlen=max(1, self.config.max_history_messages))
        self._mic = MicBuffer()
        self._resamplers: dict[int, StreamResampler] = {}
        self._turn = 0
        self._turn_start: int | None = None  # stream sample where the open turn's speech began
        self._ignore_until_end = False  # a monologue was cut: the rest of it is not a new turn
        self._partial_task: asyncio.Task | None = None
        # the partial decode in flight or done: (the mic sample its audio ends at, the decode's task)
        self._partial_decode: tuple[int, asyncio.Task] | None = None
        self._partial_upto = 0
        self._decode_seconds = 0.0  # how long the last transcription took
        self._prepared: _Prepared | None = None  # the answer being prepared for the current turn
        self._answer: _Prepared | None = None  # the answer being spoken
        self._reply_task: asyncio.Task | None = None
        self._reply_uid: int | None = None
        self._reply_said: list[str] = []
        self._times: dict[int, TurnTimes] = {}
        self._uid_turn: dict[int, int] = {}
        self._references: deque[tuple[int, np.ndarray]] = deque()  # frames sent, for the echo canceller
        self._mic_clock = 0.0  # microphone samples (16 kHz) received so far
        # the gate's settling time is about the canceller's stability: the silence rule's 500 ms, also when a
        # detector makes the VAD's own end wait longer (a longer settle would hold barge-ins longer)
        self._echo_gate = EchoGate(echo, self.vad, self.config.start_ms, self.config.end_silence_ms)
        # a pause the detector judged finished: the listener ends the turn once its silence is long enough
        self._end_requested = False
        self._last_ended: _EndedTurn | None = None
        self._dropped = [0, 0]  # speculative answers dropped in the open turn, and the tokens they cost
        self._joined = False  # the open turn continues one whose answer had started
        self._mic_offsets: deque[float] | None = deque(maxlen=100) if echo is not None else None
        # the microphone is analysed on a thread of its own: it must keep up with real time even while
        # the speech pool is busy transcribing or synthesising
        self._listener = ThreadPoolExecutor(1, thread_name_prefix="lipstream-listen")

    # ---- microphone -------------------------------------------------------------------------------------

    async def push_microphone(self, pcm: np.ndarray, sample_rate: int) -> None:
        """A chunk of the user's microphone (int16 or float, mono, 8-48 kHz), in order, as it arrives."""
        now = time.perf_counter()
        playback = self._playback_at_capture(len(pcm) * SAMPLE_RATE / max(1, sample_rate))
        loop = asyncio.get_running_loop()
        clean, events = await loop.run_in_executor(self._listener, self._analyse, pcm, sample_rate, playback)
        self._mic.append(clean, now)
        for event in events:
            await self._on_vad(event)
        if self._turn_start is None:
            keep = self._mic.end - int(SAMPLE_RATE * 2)
            if self._joinable(self._mic.end):  # a continuation would need the whole last turn
                keep = min(keep, self._last_ended.start - int(self.config.preroll_seconds * SAMPLE_RATE))
            self._mic.keep_from(keep)
            return
        if self._mic.end - self._turn_start > self.config.max_turn_seconds * SAMPLE_RATE:
            log.info("turn %d over %.0f s: cut and answered", self._turn, self.config.max_turn_seconds)
            self._ignore_until_end = True
            await self._end_turn(self._mic.end, "turn_limit")
            return
        self._maybe_partial()

    def _playback_at_capture(self, samples: float) -> int | None:
        """The pts the player was playing when the chunk's last sample was captured. Microphone and
        loudspeaker share the player's clock, so (playback - microphone samples) is constant but for
        jitter: chunks arriving late, position reports arriving late. The median of the last 2 s ignores
        both, and keeps the echo canceller from re-synchronising on every hiccup."""
        self._mic_clock += samples
        if self.echo is None or self._mic_offsets is None:
            return None
        offset = self.session.playback_position() - self._mic_clock
        self._mic_offsets.append(offset)
        return int(self._mic_clock + float(np.median(self._mic_offsets)))

    def _analyse(self, pcm: np.ndarray, rate: int, playback: int | None) -> tuple[np.ndarray, list[VadEvent]]:
        """Worker: 16 kHz float audio with the avatar's echo removed, and the VAD's events."""
        audio = to_float32(np.asarray(pcm).reshape(-1))
        if rate != SAMPLE_RATE:
            if rate not in self._resamplers:
                self._resamplers[rate] = StreamResampler(rate, SAMPLE_RATE)
            audio = self._resamplers[rate].push(audio)
        heard = audio
        if self.echo is not None:
            while self._references:  # fed here, on the same worker thread that runs the canceller
                self.echo.add_reference(*self._references.popleft())
            if audio.size:
                cleaned, echo_only = self.echo.process_gated(audio, playback)
                audio = np.asarray(cleaned, dtype=np.float32)
                # the VAD hears silence where only residual echo is left (STT still gets all of it)
                heard = np.where(echo_only, np.float32(0.0), audio)
        events = self._echo_gate.gate(self.vad.push(heard), len(heard))
        if self._end_requested and self.vad.silence_ms >= self.config.turn.finished_ms:
            ended = self.vad.end_turn()  # None when the user spoke again
            if ended is not None:
                events.append(ended)
        return audio, events

    def add_reference(self, pts: int, pcm: np.ndarray) -> None:
        """The audio of a frame the avatar plays at `pts` (what the echo canceller removes)."""
        if self.echo is not None:
            self._references.append((pts, pcm))
            while len(self._references) > 500:  # no microphone is coming in: keep the last 20 s
                self._references.popleft()

    # ---- turns ------------------------------------------------------------------------------------------

    async def _on_vad(self, event: VadEvent) -> None:
        if event.kind == "speech_start":
            if self._ignore_until_end:
                return
            await self._start_turn(event.sample)
        elif event.kind == "pause" and self._turn_start is not None:
            # a partial decode in flight goes on (a decode in a thread cannot be stopped) and is still shown:
            # no new one starts while the pause's answer is being prepared
            self._prepare(event.sample)
        elif event.kind == "resume" and self._prepared is not None:
            self._end_requested = False
            self._drop(self._prepared)
            self._prepared = None
        elif event.kind == "speech_end":
            rule: TurnRule = "detector" if self._end_requested else "max_wait" if self.detector else "silence"
            self._end_requested = False
            if self._ignore_until_end:
                self._ignore_until_end = False
                return
            if self._turn_start is not None:
                await self._end_turn(event.sample, rule)

    def _drop(self, prepared: _Prepared) -> None:
        """A speculative answer the user talked over: cancelled, its cost counted for the turn's figures."""
        prepared.cancel()
        self._dropped[0] += 1
        self._dropped[1] += prepared.tokens

    def _joinable(self, sample: int) -> bool:
        """Speech starting at `sample` would continue the last turn: it ended less than `join_seconds`
        before, and its answer is still to come or playing (a pause judged wrongly, not a new question)."""
        last = self._last_ended
        if last is None or sample - last.end > self.config.join_seconds * SAMPLE_RATE:
            return False
        answering = self._reply_task is not None and not self._reply_task.done()
        return answering or self.session.is_speaking()

    async def _start_turn(self, sample: int) -> None:
        joined = self._joinable(sample)
        if self.session.is_speaking() or (self._reply_task is not None and not self._reply_task.done()):
            await self.interrupt(continued=joined)
        message: dict[str, Any] = {"type": "user_speech_started", "mic_samples": sample}
        if joined:
            last = self._last_ended
            assert last is not None
            gap = (sample - last.end) / SAMPLE_RATE
            log.info("turn %d goes on after %.2f s: its answer is dropped", last.turn, gap)
            if self.history and self.history[-1].role == "user":
                self.history.pop()  # the unfinished question is asked again, whole
            self._turn_start = last.start
            message["joined"] = True
        else:
            self._turn += 1
            self._turn_start = sample
            self._dropped = [0, 0]
        self._joined = joined
        self._last_ended = None
        self._partial_upto = sample
        self._partial_decode = None
        await self.emit({**message, "turn": self._turn})

    async def _end_turn(self, end_sample: int, rule: TurnRule) -> None:
        turn, start = self._turn, self._turn_start
        assert start is not None
        self._turn_start = None
        self._last_ended = _EndedTurn(turn, start, end_sample)
        self._cancel(self._partial_task)
        prepared = self._prepared
        self._prepared = None
        score = prepared.score if prepared is not None and prepared.end_sample == end_sample else None
        times = TurnTimes(
            turn=turn, speech_end=self._mic.arrival_of(max(start, end_sample - 1)), rule=rule, score=score,
            joined=self._joined, dropped_answers=self._dropped[0], dropped_tokens=self._dropped[1],
        )
        self._times[turn] = times
        await self.emit({
            "type": "user_speech_ended", "turn": turn, "mic_samples": end_sample, "rule": rule,
            "score": None if score is None else round(score, 4),
        })  # fmt: skip
        if prepared is None or prepared.end_sample != end_sample:  # not speculated at a pause: start now
            if prepared is not None:
                prepared.cancel()
            prepared = self._prepare_for(start, end_sample)
        try:
            text = await prepared.task if prepared.task is not None else ""
        except (asyncio.CancelledError, LipstreamError) as exc:
            log.warning("turn %d: transcription failed: %r", turn, exc)
            text = ""
        times.transcript = prepared.transcript_at or time.perf_counter()
        if not text:
            prepared.cancel()
            audio = self._mic.slice(start, end_sample)
            rms = float(np.sqrt(np.mean(np.square(audio)))) if audio.size else 0.0
            log.info(
                "turn %d: empty transcript for %.2f s of audio at %.1f dBFS; ignored",
                turn, len(audio) / SAMPLE_RATE, 20 * np.log10(max(rms, 1e-9)),
            )
            return
        await self.emit({"type": "transcript", "turn": turn, "kind": "final", "text": text})
        self.history.append(ChatMessage("user", as_spoken(text)))  # as the model read it
        self._answer = prepared
        self._reply_task = asyncio.create_task(self._reply(turn, prepared), name=f"reply-{turn}")
        await self._report_llm_error(prepared)  # it failed while the turn was not yet decided

    def _prepare(self, sample: int) -> None:
        """At a pause the turn may be over: start preparing its answer now (kept if the pause is the end),
        and have the detector judge the pause."""
        if self._prepared is not None:
            self._drop(self._prepared)
        assert self._turn_start is not None
        self._prepared = self._prepare_for(self._turn_start, sample, judge=self.detector is not None)

    def _prepare_for(self, start: int, end_sample: int, judge: bool = False) -> _Prepared:
        """Transcribe the turn [start, end_sample), have the detector judge it (`judge`), then stream the
        model's answer into a queue."""
        audio = self._mic.slice(start - int(self.config.preroll_seconds * SAMPLE_RATE), end_sample)
        prepared = _Prepared(end_sample=end_sample)
        history = list(self.history)
        covering = self._partial_covering(end_sample)
        turn = self._turn
        # an audio detector starts at once, beside the transcription; a text one needs the transcript
        heard = self._mic.slice(end_sample - TURN_AUDIO_SAMPLES) if judge else audio
        early = None
        if judge and self.detector is not None and not self.detector.needs_text:
            early = asyncio.create_task(self.detector.score(heard, []))

        async def run() -> str:
            text = await covering if covering is not None else await self._transcribe(audio)
            prepared.transcript_at = time.perf_counter()
            user = ChatMessage("user", as_spoken(text))
            messages = [ChatMessage("system", self.config.system_prompt), *history, user]
            if judge and text:
                await self._judge(prepared, turn, heard, messages, early)
            if text:
                prepared.feeder = asyncio.create_task(self._feed(messages, prepared))
            return text

        prepared.task = asyncio.create_task(run())
        return prepared

    async def _judge(
        self, prepared: _Prepared, turn: int, audio: np.ndarray, messages: list[ChatMessage],
        early: asyncio.Task | None,
    ) -> None:
        """The detector's judgement of a pause: sent to the client (`turn_decision`); a finished turn is
        ended by the listener as soon as its silence is `finished_ms` long. A detector that fails leaves the
        turn to the hard cap."""
        assert self.detector is not None
        try:
            score = await early if early is not None else await self.detector.score(audio, messages)
        except LipstreamError as exc:
            log.warning("turn %d: the %s turn detector failed: %s", turn, self.detector.name, exc)
            return
        prepared.score = score
        finished = self.config.turn.finished(score)
        log.info(
            "turn %d: %s detector %.4f (%s), %.0f ms after the pause (transcript %.0f ms)", turn,
            self.detector.name, score, "finished" if finished else "not yet",
            (time.perf_counter() - prepared.created_at) * 1000,
            ((prepared.transcript_at or prepared.created_at) - prepared.created_at) * 1000,
        )  # fmt: skip
        if finished and self._prepared is prepared:
            self._end_requested = True
        await self.emit({
            "type": "turn_decision", "turn": turn, "finished": finished, "score": round(score, 4),
            "detector": self.detector.name,
        })  # fmt: skip

    async def _feed(self, messages: list[ChatMessage], prepared: _Prepared) -> None:
        """The model's reply into the prepared queue: text deltas, then _END or the LLMError."""
        try:
            async for delta in self.llm.stream(messages, self.config.max_reply_tokens):
                if prepared.first_token_at is None:
                    prepared.first_token_at = time.perf_counter()
                prepared.tokens += 1
                prepared.deltas.put_nowait(delta)
            prepared.deltas.put_nowait(_END)
        except LLMError as exc:
            prepared.deltas.put_nowait(exc)
            prepared.error = exc
            if self._answer is prepared:  # the client hears of it now, not after what was written is played
                await self._report_llm_error(prepared)

    async def _report_llm_error(self, prepared: _Prepared) -> None:
        """Send the model's failure on this answer as an `error` event, once."""
        if prepared.error is None or prepared.error_reported:
            return
        prepared.error_reported = True
        log.warning("language model failed: %s", prepared.error)
        await self.emit({"type": "error", "code": "llm", "message": str(prepared.error), "fatal": False})

    def _partial_covering(self, end_sample: int) -> asyncio.Task | None:
        """A partial decode of this turn whose audio already holds all of it (it was started in the silence
        after the last word): its text is the final transcript, so it is awaited, not decoded again. On 2
        cores a second decode would also run beside it (a decode in a thread cannot be stopped)."""
        if self._partial_decode is None:
            return None
        upto, decode = self._partial_decode
        if upto < end_sample or decode.cancelled():
            return None
        return decode

    async def _transcribe(self, audio: np.ndarray, stt: SpeechToText | None = None) -> str:
        if audio.size < SAMPLE_RATE // 10:
            return ""
        started = time.perf_counter()
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self.recogniser, (stt or self.stt).transcribe, audio)
        self._decode_seconds = time.perf_counter() - started
        log.debug(
            "%s transcript of %.2f s: %.0f ms decoding, %.0f ms in all", "partial" if stt else "final",
            len(audio) / SAMPLE_RATE, 1000 * getattr(result, "elapsed_s", 0.0), 1000 * self._decode_seconds,
        )  # fmt: skip
        return result.text.strip()

    def _maybe_partial(self) -> None:
        """Re-decode the growing turn every `partial_every_seconds` (one decode at a time)."""
        if self._partial_task is not None and not self._partial_task.done():
            return
        if self._prepared is not None:  # paused: the answer is being prepared
            return
        # never more often than every `partial_every_seconds`, nor than 1.5x what a decode takes, so the
        # recogniser stays free for the final transcript
        every = max(self.config.partial_every_seconds, 1.5 * self._decode_seconds)
        if self._mic.end - self._partial_upto < every * SAMPLE_RATE:
            return
        assert self._turn_start is not None
        self._partial_upto = self._mic.end
        audio = self._mic.slice(self._turn_start - int(self.config.preroll_seconds * SAMPLE_RATE))
        decode = asyncio.create_task(self._transcribe(audio, self.partial_stt))
        self._partial_decode = (self._partial_upto, decode)
        self._partial_task = asyncio.create_task(self._partial(self._turn, decode))

    async def _partial(self, turn: int, decode: asyncio.Task) -> None:
        text = await asyncio.shield(decode)  # the decode may become the final transcript: outlive this
        if text and turn == self._turn and self._turn_start is not None:
            await self.emit({"type": "transcript", "turn": turn, "kind": "partial", "text": text})

    # ---- answering --------------------------------------------------------------------------------------

    async def _reply(self, turn: int, prepared: _Prepared) -> None:
        times = self._times[turn]
        self._reply_said = []

        def started(uid: int) -> None:
            self._reply_uid = uid
            self._uid_turn[uid] = turn

        def audio_ready(_speech: object) -> None:
            if times.first_audio is None:
                times.first_audio = time.perf_counter()

        try:
            sentences = self._sentences(prepared, times)
            speeches = await self.speaker.speak(sentences, self.config.voice, on_speech=audio_ready)
            await self.session.push_speech_stream(speeches, on_utterance=started)
        except asyncio.CancelledError:
            prepared.cancel()
            raise
        except LipstreamError as exc:  # TTS refused a sentence: the turn ends, the session goes on
            log.warning("turn %d: reply failed: %s", turn, exc)
            await self.emit({"type": "error", "code": "llm", "message": str(exc), "fatal": False})

    async def _sentences(self, prepared: _Prepared, times: TurnTimes) -> AsyncIterator[str]:
        """The model's reply as speakable sentences, as soon as each is complete."""
        splitter = SentenceStream()
        said_any = False
        while True:
            item = await prepared.deltas.get()
            if times.llm_first_token is None and prepared.first_token_at is not None:
                times.llm_first_token = prepared.first_token_at
            if isinstance(item, LLMError):
                prepared.error = item
                await self._report_llm_error(prepared)
                if not said_any and self.config.apology:
                    yield self.config.apology  # not kept in the history: the model did not say it
                return
            pieces = splitter.flush() if item is _END else splitter.push(item)
            for sentence in pieces:
                if spoken := speakable(sentence):
                    said_any = True
                    self._reply_said.append(spoken)
                    yield spoken
            if item is _END:
                return

    async def interrupt(self, continued: bool = False) -> None:
        """Stop the avatar now (the user speaks over it, or pressed Stop): cut the answer and cancel the
        language model; the history keeps what was heard of the answer. `continued`: the user went on with
        the question this answer was for: what was heard of it is not kept, and the turn's figures wait
        for the answer to the whole question."""
        self._cancel(self._reply_task)
        self._reply_task = None
        if self._answer is not None:
            self._answer.cancel()  # the model stops writing
            if continued:  # an answer to half a question: its cost is the turn's speculation
                self._dropped[0] += 1
                self._dropped[1] += self._answer.tokens
            self._answer = None
        cut = self.session.interrupt()
        uid = self._reply_uid
        if uid is not None and continued:
            self._uid_turn.pop(uid, None)  # its playback_finished no longer reports the turn
        elif uid is not None:
            heard = self.session.heard_text(uid, cut)
            if heard:
                self.history.append(ChatMessage("assistant", heard + " ..."))
            turn = self._uid_turn.get(uid)
            if turn in self._times:
                self._times[turn].interrupted = True
                await self._report(self._times[turn])
        self._reply_uid = None
        self._reply_said = []

    # ---- the stream going out ---------------------------------------------------------------------------

    async def on_stream_event(self, event: Any) -> dict[str, Any] | None:
        """Called as each session event is sent: what to send for a `text` event (a reply_text), and the
        bookkeeping of the reply's first frame and end."""
        turn = self._uid_turn.get(event.utterance_id) if event.utterance_id is not None else None
        if event.type == "speech_started" and turn is not None:
            times = self._times.get(turn)
            if times is not None and times.first_frame is None:
                times.first_frame = time.perf_counter()
        elif event.type == "playback_finished" and turn is not None:
            if event.utterance_id == self._reply_uid:
                if not event.interrupted and self._reply_said:
                    self.history.append(ChatMessage("assistant", " ".join(self._reply_said)))
                self._reply_uid = None
                self._reply_said = []
            times = self._times.get(turn)
            if times is not None:  # the answer is over (played or cut): its figures are final
                times.interrupted = times.interrupted or bool(event.interrupted)
                await self._report(times)
        elif event.type == "text" and turn is not None:
            return {
                "type": "reply_text", "turn": turn, "utterance_id": event.utterance_id,
                "position_samples": event.position_samples, "text": event.message,
            }
        return None

    async def _report(self, times: TurnTimes) -> None:
        if times.reported:
            return
        times.reported = True
        message = {
            "type": "turn_metrics", "turn": times.turn, "interrupted": times.interrupted,
            "end_rule": times.rule, "end_score": None if times.score is None else round(times.score, 4),
            "joined": times.joined,
            "speculation": {"dropped_answers": times.dropped_answers, "dropped_tokens": times.dropped_tokens},
        }  # fmt: skip
        await self.emit({**message, "ms": times.as_ms()})

    async def aclose(self) -> None:
        """Cancel whatever is in flight."""
        decode = self._partial_decode[1] if self._partial_decode is not None else None
        for task in (self._partial_task, decode, self._reply_task):
            self._cancel(task)
        if self._prepared is not None:
            self._prepared.cancel()
        self._listener.shutdown(wait=False, cancel_futures=True)
        if self._own_recogniser:
            self.recogniser.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def _cancel(task: asyncio.Task | None) -> None:
        if task is not None and not task.done():
            task.cancel()

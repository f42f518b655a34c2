"""The conversation loop over a Session: the turn state machine between the user's microphone and the
avatar's spoken answers.

Its parts, each with one job: the microphone listener (listener.py: resampling, echo, VAD), recognition
that keeps up while the user speaks (transcriber.py: stable words committed, only the tail decoded at the
end), answer preparation (answers.py: transcript -> model -> sentences -> speech). This module decides when
a turn starts, pauses, resumes and ends, speculates an answer at each pause, and cuts the answer when the
user talks over it (barge-in: the history keeps only what was heard). Events for the client go to the
injected `emit` coroutine.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.errors import LipstreamError
from lipstream.talk.answers import AnswerMaker, PreparedAnswer
from lipstream.talk.conversation_types import ConversationConfig, Emit, TurnTimes, same_words
from lipstream.talk.echo import EchoCanceller
from lipstream.talk.grounding_port import Grounding
from lipstream.talk.listener import MicListener
from lipstream.talk.llm import ChatMessage, LanguageModel, as_spoken
from lipstream.talk.session_port import SessionPort
from lipstream.talk.speaker import Speaker
from lipstream.talk.stt import SpeechToText
from lipstream.talk.transcriber import LiveTranscription, TurnRecogniser
from lipstream.talk.turn_end import TurnDetector, TurnRule
from lipstream.talk.vad import VadEvent, VoiceActivityDetector
from lipstream.threads import background_pool

log = logging.getLogger(__name__)

TURN_AUDIO_SAMPLES = 8 * SAMPLE_RATE  # what an audio turn detector hears: the last 8 s


@dataclass(frozen=True)
class _EndedTurn:
    """The last turn that ended: a continuation that starts soon after joins it."""

    turn: int
    start: int  # stream samples
    end: int
    heard: LiveTranscription  # its committed words stay valid if it is continued


class Conversation:
    """One user talking with the avatar of one Session (Pipecat or LiveKit users would wrap this)."""

    def __init__(
        self,
        session: SessionPort,
        stt: SpeechToText,
        llm: LanguageModel,
        emit: Emit,
        config: ConversationConfig | None = None,
        *,
        vad: VoiceActivityDetector | None = None,
        echo: EchoCanceller | None = None,
        partial_stt: SpeechToText | None = None,
        speaker: Speaker | None = None,
        recogniser: Executor | None = None,
        detector: TurnDetector | None = None,
        grounding: Grounding | None = None,
    ) -> None:
        """`session`: a started lipstream Session; `emit`: sends an event dict to the client; `echo`: an
        echo canceller fed with what the avatar plays (None: the microphone is used as it comes);
        `partial_stt`: the recogniser for decodes while the user speaks (default `stt`), so the final
        decode, on the critical path, never shares its model with them; `speaker`: the voices answers are
        spoken with (a server's, shared); `recogniser`: the threads transcription runs on (default: two of
        its own); `detector`: judges each pause when the config's turn rule uses one (`config.turn`);
        `grounding`: a knowledge source the answers are written from (None: the model alone)."""
        self.session = session
        self.stt = stt
        self.partial_stt = partial_stt or stt
        self.emit = emit
        self.config = config or ConversationConfig()
        if self.config.turn.uses_detector and detector is None:
            raise ValueError(f"the {self.config.turn.detector!r} turn rule needs a detector")
        self.detector = detector if self.config.turn.uses_detector else None
        self.grounding = grounding
        self._own_recogniser = recogniser is None
        # recognition is on the answer's critical path: not nicer than frame work (issue 35)
        self.recogniser = recogniser or background_pool(2, "lipstream-stt", niceness=0)
        vad = vad or VoiceActivityDetector(
            start_ms=self.config.start_ms, end_silence_ms=self.config.vad_end_silence_ms,
            pause_ms=self.config.pause_ms,
        )  # fmt: skip
        self.listener = MicListener(vad, echo, self.config.start_ms, self.config.end_silence_ms)
        speaker = speaker or Speaker()
        self.answers = AnswerMaker(llm, speaker, session, self.config, emit, grounding, self.detector)
        self.history: deque[ChatMessage] = deque(maxlen=max(1, self.config.max_history_messages))
        self._turn = 0
        self._turn_start: int | None = None  # stream sample where the open turn's speech began
        self._ignore_until_end = False  # a monologue was cut: the rest of it is not a new turn
        self._heard: LiveTranscription | None = None  # the open turn's recognition
        self._partial_task: asyncio.Task | None = None  # shows the partial decode in flight
        self._prepared: PreparedAnswer | None = None  # the answer being prepared for the current turn
        # an answer the user spoke past: taken over if their words come out the same
        self._resumed: PreparedAnswer | None = None
        self._answer: PreparedAnswer | None = None  # the answer being spoken
        self._reply_task: asyncio.Task | None = None
        self._reply_uid: int | None = None
        self._reply_said: list[str] = []
        self._times: dict[int, TurnTimes] = {}
        self._uid_turn: dict[int, int] = {}
        self._last_ended: _EndedTurn | None = None
        self._dropped = [0, 0]  # speculative answers dropped in the open turn, and the tokens they cost
        self._kept_after_resume = False  # the open turn's answer survived the user going on
        self._joined = False  # the open turn continues one whose answer had started

    @property
    def mic(self):  # noqa: ANN201 - the listener's MicBuffer
        """The microphone's recent audio."""
        return self.listener.mic

    # ---- microphone -------------------------------------------------------------------------------------

    async def push_microphone(self, pcm: np.ndarray, sample_rate: int) -> None:
        """A chunk of the user's microphone (int16 or float, mono, 8-48 kHz), in order, as it arrives."""
        events = await self.listener.hear(pcm, sample_rate, self.session.playback_position())
        for event in events:
            await self._on_vad(event)
        if self._judged_finished() and self.listener.silence_ms >= self.config.turn.finished_ms:
            ended = await self.listener.end_turn()  # None when the user spoke again meanwhile
            if ended is not None:
                await self._on_vad(ended)
        mic = self.listener.mic
        if self._turn_start is None:
            keep = mic.end - int(SAMPLE_RATE * 2)
            if self._joinable(mic.end):  # a continuation would need the whole last turn
                assert self._last_ended is not None
                keep = min(keep, self._last_ended.start - self._preroll)
            mic.keep_from(keep)
            return
        if mic.end - self._turn_start > self.config.max_turn_seconds * SAMPLE_RATE:
            log.info("turn %d over %.0f s: cut and answered", self._turn, self.config.max_turn_seconds)
            self._ignore_until_end = True
            await self._end_turn(mic.end, "turn_limit")
            return
        self._maybe_partial()

    def add_reference(self, pts: int, pcm: np.ndarray) -> None:
        """The audio of a frame the avatar plays at `pts` (what the echo canceller removes)."""
        self.listener.add_reference(pts, pcm)

    @property
    def _preroll(self) -> int:
        return int(self.config.preroll_seconds * SAMPLE_RATE)

    def _judged_finished(self) -> bool:
        """The detector judged the current pause the end of the turn (it ends once silent long enough)."""
        prepared = self._prepared
        if prepared is None or prepared.score is None:
            return False
        return self.config.turn.finished(prepared.score)

    # ---- turns ------------------------------------------------------------------------------------------

    async def _on_vad(self, event: VadEvent) -> None:
        if event.kind == "speech_start":
            if not self._ignore_until_end:
                await self._start_turn(event.sample)
        elif event.kind == "pause" and self._turn_start is not None:
            # a partial decode in flight goes on (a decode in a thread cannot be stopped) and is still shown:
            # no new one starts while the pause's answer is being prepared
            self._prepare(event.sample)
        elif event.kind == "resume" and self._prepared is not None:
            self._set_aside(self._prepared)
            self._prepared = None
        elif event.kind == "speech_end":
            rule: TurnRule = "silence"
            if self.detector is not None:
                rule = "detector" if self._judged_finished() else "max_wait"
            if self._ignore_until_end:
                self._ignore_until_end = False
                return
            if self._turn_start is not None:
                await self._end_turn(event.sample, rule)

    def _set_aside(self, prepared: PreparedAnswer) -> None:
        """The user went on after a pause: the answer prepared there waits, in case what they add does not
        change the words (a cough, a breath, "um"); the one set aside before it is dropped."""
        if self._resumed is not None:
            self._drop(self._resumed)
        self._resumed = prepared

    def _drop(self, prepared: PreparedAnswer) -> None:
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
            self._heard = last.heard
            self._heard.restart(sample)
            message["joined"] = True
        else:
            self._turn += 1
            self._turn_start = sample
            streaming = self.config.streaming_recognition
            recog = TurnRecogniser(self.partial_stt, self.stt, sample - self._preroll, streaming=streaming)
            self._heard = LiveTranscription(recog, self.recogniser, self.config.partial_every_seconds, sample)
            self._dropped = [0, 0]
            self._kept_after_resume = False
        self._joined = joined
        self._last_ended = None
        await self.emit({**message, "turn": self._turn})

    async def _end_turn(self, end_sample: int, rule: TurnRule) -> None:
        turn, start, heard = self._turn, self._turn_start, self._heard
        assert start is not None and heard is not None
        decided = time.perf_counter()
        self._turn_start = None
        self._last_ended = _EndedTurn(turn, start, end_sample, heard)
        self._cancel(self._partial_task)
        prepared, self._prepared = self._prepared, None
        resumed, self._resumed = self._resumed, None
        score = prepared.score if prepared is not None and prepared.end_sample == end_sample else None
        times = TurnTimes(
            turn=turn, speech_end=self.listener.mic.arrival_of(max(start, end_sample - 1)), rule=rule,
            score=score, joined=self._joined, decision=decided,
        )  # fmt: skip
        self._times[turn] = times
        await self.emit({
            "type": "user_speech_ended", "turn": turn, "mic_samples": end_sample, "rule": rule,
            "score": None if score is None else round(score, 4),
        })  # fmt: skip
        if prepared is None or prepared.end_sample != end_sample:  # not speculated at this pause: start now
            if prepared is not None:
                self._drop(prepared)
            prepared = self._prepare_for(end_sample, resumed=resumed)
        else:
            times.speculation = "pause"
            if resumed is not None:
                self._drop(resumed)
        times.dropped_answers, times.dropped_tokens = self._dropped
        try:
            text = await prepared.task if prepared.task is not None else ""
        except (asyncio.CancelledError, LipstreamError) as exc:
            log.warning("turn %d: transcription failed: %r", turn, exc)
            if isinstance(exc, LipstreamError):  # the recogniser failed: the turn is lost, not the session
                await self.emit({"type": "error", "code": "stt", "message": str(exc), "fatal": False})
            text = ""
        times.transcript = prepared.transcript_at or time.perf_counter()
        if self._kept_after_resume:
            times.speculation = "resumed"
        if not text:
            prepared.cancel()
            audio = self.listener.mic.slice(start, end_sample)
            rms = float(np.sqrt(np.mean(np.square(audio)))) if audio.size else 0.0
            log.info(
                "turn %d: empty transcript for %.2f s of audio at %.1f dBFS; ignored",
                turn, len(audio) / SAMPLE_RATE, 20 * np.log10(max(rms, 1e-9)),
            )  # fmt: skip
            return
        await self.emit({"type": "transcript", "turn": turn, "kind": "final", "text": text})
        self.history.append(ChatMessage("user", as_spoken(text)))  # as the model read it
        self._answer = prepared
        self._reply_task = asyncio.create_task(self._reply(turn, prepared), name=f"reply-{turn}")
        await self.answers.report_error(prepared)  # it failed while the turn was not yet decided

    def _prepare(self, sample: int) -> None:
        """At a pause the turn may be over: start preparing its answer now (kept if the pause is the end),
        and have the detector judge the pause."""
        if self._prepared is not None:
            self._drop(self._prepared)
        self._prepared = self._prepare_for(sample, judge=self.detector is not None, resumed=self._resumed)
        self._resumed = None

    def _prepare_for(
        self, end_sample: int, judge: bool = False, resumed: PreparedAnswer | None = None
    ) -> PreparedAnswer:
        """Transcribe the turn up to `end_sample`, have the detector judge it (`judge`), then stream the
        model's answer into a queue. An answer set aside at an earlier pause (`resumed`) is taken over
        when the transcript comes out the same: its model output is not thrown away."""
        prepared = PreparedAnswer(end_sample=end_sample)
        history = list(self.history)
        transcription = self._heard
        turn = self._turn
        # an audio detector starts at once, beside the transcription; a text one needs the transcript
        last_audio = self.listener.mic.slice(end_sample - TURN_AUDIO_SAMPLES) if judge else None
        early = None
        if judge and last_audio is not None and self.detector is not None and not self.detector.needs_text:
            early = asyncio.create_task(self.detector.score(last_audio, []))

        async def run() -> str:
            text = "" if transcription is None else await transcription.final(self.listener.mic, end_sample)
            prepared.transcript_at = time.perf_counter()
            prepared.text = text
            if not text:
                return text
            # the detector reads the answer's own prompt, so the model's prompt cache serves both
            messages = self.answers.messages(prepared, history, text)
            taken_over = resumed is not None and same_words(resumed.text, text) and resumed.feeder is not None
            if resumed is not None and taken_over:
                prepared.take_over(resumed)
                self._kept_after_resume = True
            elif resumed is not None:
                self._drop(resumed)
            if not taken_over and self.answers.answer_first:  # a judge of its own works beside the answer
                self.answers.start(prepared, messages)
            if judge and last_audio is not None:
                await self._judge(prepared, turn, last_audio, messages, early)
            if not taken_over and not self.answers.answer_first:
                self.answers.start(prepared, messages)
            return text

        prepared.task = asyncio.create_task(run())
        return prepared

    async def _judge(
        self, prepared: PreparedAnswer, turn: int, audio: np.ndarray, messages: list[ChatMessage],
        early: asyncio.Task | None,
    ) -> None:
        """The detector's judgement of a pause: sent to the client (`turn_decision`); a finished turn is
        ended by the next microphone chunk that finds its silence `finished_ms` long. A detector that fails
        leaves the turn to the hard cap."""
        assert self.detector is not None
        try:
            score = await early if early is not None else await self.detector.score(audio, messages)
        except LipstreamError as exc:
            log.warning("turn %d: the %s turn detector failed: %s", turn, self.detector.name, exc)
            return
        prepared.score = score
        prepared.judged_at = time.perf_counter()
        finished = self.config.turn.finished(score)
        log.info(
            "turn %d: %s detector %.4f (%s), %.0f ms after the pause (transcript %.0f ms)", turn,
            self.detector.name, score, "finished" if finished else "not yet",
            (prepared.judged_at - prepared.created_at) * 1000,
            ((prepared.transcript_at or prepared.created_at) - prepared.created_at) * 1000,
        )  # fmt: skip
        await self.emit({
            "type": "turn_decision", "turn": turn, "finished": finished, "score": round(score, 4),
            "detector": self.detector.name,
        })  # fmt: skip

    def _maybe_partial(self) -> None:
        """Decode the growing turn's undecided tail now and then, committing the words that are stable; when
        a silence begins, the final decode at once (the pause that may end the turn is seen ~64 ms later)."""
        heard = self._heard
        if self._prepared is not None or heard is None:  # paused: the answer is being prepared
            return
        mic = self.listener.mic
        silence = int(self.listener.silence_ms * SAMPLE_RATE / 1000)
        if silence:
            # once per silence, never twice at once on the final recogniser (a partial may run beside it)
            if not heard.covers(mic.end - silence) and not heard.final_in_flight():
                final = heard.start_final(mic)
                self._partial_task = asyncio.create_task(self._partial(self._turn, final, read_ahead=False))
            return
        if heard.due(mic.end):
            decode = heard.start_partial(mic)
            self._partial_task = asyncio.create_task(self._partial(self._turn, decode))

    async def _partial(self, turn: int, decode: asyncio.Task, read_ahead: bool = True) -> None:
        """Show a decode's text; the model reads it ahead unless it is the final decode, a silence began (the
        final decode runs: a read-ahead beside it slowed it), or the pause's answer is being prepared: the
        judgement reads that prompt next, and a read-ahead queued before it only delays it (20-67 ms)."""
        try:
            text = await asyncio.shield(decode)  # the decode may become the final transcript: outlive this
        except LipstreamError as exc:  # the final decode will say so, once, if the recogniser stays down
            log.debug("turn %d: a partial decode failed: %s", turn, exc)
            return
        if text and turn == self._turn and self._turn_start is not None:
            await self.emit({"type": "transcript", "turn": turn, "kind": "partial", "text": text})
            if self.grounding is not None:
                self.grounding.prefetch(text)  # retrieval on the partial: the turn pays nothing for it
            heard = self._heard
            silent = self.listener.silence_ms > 0 or (heard is not None and heard.final_in_flight())
            if read_ahead and self._prepared is None and not silent:
                self.answers.read_ahead(list(self.history), text)

    # ---- answering --------------------------------------------------------------------------------------

    async def _reply(self, turn: int, prepared: PreparedAnswer) -> None:
        self._reply_said = []

        def started(uid: int) -> None:
            self._reply_uid = uid
            self._uid_turn[uid] = turn

        await self.answers.speak(turn, prepared, self._times[turn], self._reply_said, started)

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
            message = {
                "type": "reply_text", "turn": turn, "utterance_id": event.utterance_id,
                "position_samples": event.position_samples, "text": event.message,
            }  # fmt: skip
            answer = self._answer
            if answer is not None and answer.grounded is not None:
                message["sources"] = list(answer.grounded.sources)
            return message
        return None

    async def _report(self, times: TurnTimes) -> None:
        if times.reported:
            return
        times.reported = True
        await self.emit(times.as_event())

    async def aclose(self) -> None:
        """Cancel whatever is in flight."""
        if self._heard is not None:
            self._heard.cancel()
        self.answers.close()
        for task in (self._partial_task, self._reply_task):
            self._cancel(task)
        for prepared in (self._prepared, self._resumed):
            if prepared is not None:
                prepared.cancel()
        self.listener.close()
        if self._own_recogniser:
            self.recogniser.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def _cancel(task: asyncio.Task | None) -> None:
        if task is not None and not task.done():
            task.cancel()

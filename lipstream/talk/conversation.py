"""The conversation loop over a Session: the async driver of the turn machine between the user's microphone
and the avatar's spoken answers.

Its parts, each with one job: the microphone listener (listener.py: resampling, echo, VAD), the turn machine
(turns.py: when a turn starts, pauses, resumes and ends, as named states and actions), recognition that
keeps up while the user speaks (transcriber.py), and answers (answers.py: prepared at each pause, judged,
written and spoken). This module carries out the machine's actions, cuts the answer when the user talks over
it (barge-in: the history keeps only what was heard) and keeps each turn's report. Events for the client go
to the injected `emit` coroutine; the observer hears of each turn's report.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from concurrent.futures import Executor
from typing import Any

import numpy as np

from lipstream.audio.timeline import FPS, SAMPLE_RATE
from lipstream.errors import LipstreamError
from lipstream.talk.answers import AnswerMaker, PreparedAnswer
from lipstream.talk.conversation_types import ConversationConfig, ConversationObserver, Emit, TurnReport
from lipstream.talk.hearing.echo import EchoCanceller
from lipstream.talk.hearing.listener import MicListener
from lipstream.talk.hearing.stt import SpeechToText
from lipstream.talk.hearing.transcriber import FinalsInFlight, LiveTranscription, TurnRecogniser
from lipstream.talk.hearing.vad import VadEvent, VoiceActivityDetector
from lipstream.talk.knowledge.grounding_port import Grounding
from lipstream.talk.models.llm import ChatMessage, LanguageModel, as_spoken
from lipstream.talk.seats import Seat
from lipstream.talk.session_port import SessionPort
from lipstream.talk.turn_end import TurnDetector
from lipstream.talk.turns import (
    AgentState,
    ContinueTurn,
    DropAnswer,
    EndInSilence,
    EndTurn,
    Interrupt,
    PrepareAnswer,
    SetAside,
    StartTurn,
    TurnAction,
    TurnMachine,
    TurnTiming,
    UserState,
)
from lipstream.talk.voices.speaker import Speaker
from lipstream.threads import background_pool

log = logging.getLogger(__name__)


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
        observer: ConversationObserver | None = None,
        seat: Seat | None = None,
        finals: FinalsInFlight | None = None,
    ) -> None:
        """`session`: a started lipstream Session; `emit`: sends an event dict to the client; `echo`: an
        echo canceller fed with what the avatar plays (None: the microphone is used as it comes);
        `partial_stt`: the recogniser for decodes while the user speaks (default `stt`), so the final
        decode, on the critical path, never shares its model with them; `speaker`: the voices answers are
        spoken with (a server's, shared); `recogniser`: the threads transcription runs on (default: two of
        its own); `detector`: judges each pause when the config's turn rule uses one (`config.turn`);
        `grounding`: a knowledge source the answers are written from (None: the model alone); `observer`:
        told of each turn's report (the server's metrics); `seat`: its place among the server's
        conversations (lipstream.talk.seats): while in line, a turn's end is not judged, the wait line is
        said at once and the answer is written once seated; `finals`: the final transcripts in flight on
        the shared recogniser (no partial decode starts while one is)."""
        self.session = session
        self.stt = stt
        self.partial_stt = partial_stt or stt
        self.emit = emit
        self.config = config or ConversationConfig()
        if self.config.turn.uses_detector and detector is None:
            raise ValueError(f"the {self.config.turn.detector!r} turn rule needs a detector")
        self.detector = detector if self.config.turn.uses_detector else None
        self.grounding = grounding
        self.observer = observer
        self._own_recogniser = recogniser is None
        # recognition is on the answer's critical path: not nicer than frame work (issue 35)
        self.recogniser = recogniser or background_pool(2, "lipstream-stt", niceness=0)
        vad = vad or self.config.voice_activity()
        self.listener = MicListener(vad, echo, self.config.start_ms, self.config.end_silence_ms)
        cfg = self.config
        self.turns = TurnMachine(
            TurnTiming.of(cfg.turn, cfg.join_seconds, cfg.max_turn_seconds, cfg.join_heard_seconds)
        )
        self.answers = AnswerMaker(
            llm, speaker or Speaker(), session, cfg, emit, grounding, self.detector,
            on_judged=self.turns.judged, seat=seat,
        )
        self.history: deque[ChatMessage] = deque(maxlen=max(1, cfg.max_history_messages))
        self._heard: LiveTranscription | None = None  # the open (or last) turn's recognition
        self._silence_ms = 0.0  # the open turn's silence after the last chunk (the listener's reading)
        self._partial_task: asyncio.Task | None = None  # shows the partial decode in flight
        self._pending: dict[int, PreparedAnswer] = {}  # answers prepared at pauses, by the pause's sample
        self._answer: PreparedAnswer | None = None  # the answer being spoken
        self._reply_task: asyncio.Task | None = None
        self._replying: TurnReport | None = None  # the report of the answer being spoken
        self._finishing: asyncio.Task | None = None  # waits for the answer's last frame to be heard
        self._reports: dict[int, TurnReport] = {}  # turns whose figures are not yet final
        self.seat = seat
        self.finals = finals or FinalsInFlight()
        self._states = (self.turns.agent.value, self.turns.user.value, 0)  # the last `state` sent
        self._seat_task: asyncio.Task | None = None

    @property
    def mic(self):  # noqa: ANN201 - the listener's MicBuffer
        """The microphone's recent audio."""
        return self.listener.mic

    @property
    def states(self) -> tuple[AgentState, UserState]:
        """The avatar's state and the user's, as the turn machine sees them."""
        return self.turns.agent, self.turns.user

    # ---- microphone -------------------------------------------------------------------------------------

    async def push_microphone(self, pcm: np.ndarray, sample_rate: int) -> None:
        """A chunk of the user's microphone (int16 or float, mono, 8-48 kHz), in order, as it arrives."""
        heard = await self.listener.hear(pcm, sample_rate, self.session.playback_position())
        self._silence_ms = heard.silence_ms
        for event in heard.events:
            await self._on_vad(event)
        await self._carry_out(self.turns.silence(heard.silence_ms))
        mic = self.listener.mic
        keep = self.turns.keep_from(mic.end, self.answering, self._preroll)
        if keep is not None:
            mic.keep_from(keep)
            return
        if cut := self.turns.heard_until(mic.end):
            log.info("turn %d over %.0f s: cut and answered", self.turns.turn, self.config.max_turn_seconds)
            await self._carry_out(cut)
            return
        self._maybe_partial()

    def add_reference(self, pts: int, pcm: np.ndarray) -> None:
        """The audio of a frame the avatar plays at `pts` (what the echo canceller removes)."""
        self.listener.add_reference(pts, pcm)

    @property
    def _preroll(self) -> int:
        return int(self.config.preroll_seconds * SAMPLE_RATE)

    @property
    def answering(self) -> bool:
        """The avatar speaks, or an answer is on its way to the session."""
        return self.session.is_speaking() or (self._reply_task is not None and not self._reply_task.done())

    # ---- the turn machine's actions ---------------------------------------------------------------------

    async def _on_vad(self, event: VadEvent) -> None:
        if event.kind == "speech_start":
            heard = self._answer_heard(event.sample)
            actions = self.turns.speech_started(event.sample, self.answering, heard)
        elif event.kind == "pause":
            # a partial decode in flight goes on (a decode in a thread cannot be stopped) and is still shown:
            # no new one starts while the pause's answer is being prepared
            actions = self.turns.paused(event.sample)
        elif event.kind == "resume":
            actions = self.turns.resumed()
        else:
            actions = self.turns.speech_ended(event.sample)
        await self._carry_out(actions)

    def _answer_heard(self, sample: int) -> int:
        """Samples of the answer being spoken that had played when the user's speech began at microphone
        sample `sample` (the player's position now, less the microphone heard since then)."""
        report = self._replying
        if report is None or report.first_pts is None:
            return 0
        then = self.session.playback_position() - (self.listener.mic.end - sample)
        return max(0, then - report.first_pts)

    async def _carry_out(self, actions: list[TurnAction]) -> None:
        for action in actions:
            if isinstance(action, Interrupt):
                await self.interrupt(continued=action.continued)
            elif isinstance(action, StartTurn):
                await self._start_turn(action)
            elif isinstance(action, ContinueTurn):
                await self._continue_turn(action)
            elif isinstance(action, PrepareAnswer):
                resumed = None if action.resume_from is None else self._pending.pop(action.resume_from, None)
                waiting = self.answers.waiting
                self._pending[action.end_sample] = self.answers.prepare(
                    self.turns.turn, action.end_sample, self._heard, self.listener.mic, list(self.history),
                    judge=action.judge and not waiting, resumed=resumed,
                )  # fmt: skip
                if action.judge and waiting:  # in line the model is not asked: the pause ends the turn
                    self.turns.judged(action.end_sample, 1.0)
            elif isinstance(action, DropAnswer):
                if (dropped := self._pending.pop(action.end_sample, None)) is not None:
                    self.answers.drop(dropped)
            elif isinstance(action, EndInSilence):
                ended = await self.listener.end_turn()  # None when the user spoke again meanwhile
                if ended is not None:
                    await self._on_vad(ended)
            elif isinstance(action, EndTurn):
                await self._end_turn(action)
            else:  # SetAside: the answer stays pending under its pause's sample, for a later PrepareAnswer
                assert isinstance(action, SetAside)
        await self._states_changed()

    async def _start_turn(self, action: StartTurn) -> None:
        streaming = self.config.streaming_recognition
        recog = TurnRecogniser(
            self.partial_stt, self.stt, action.start - self._preroll, streaming=streaming,
            whole_turn_seconds=self.config.commit_after_seconds,
        )  # fmt: skip
        every = self.config.partial_every_seconds
        self._heard = LiveTranscription(recog, self.recogniser, every, action.start, self.finals)
        self.answers.dropped = (0, 0)
        await self.emit({"type": "user_speech_started", "mic_samples": action.start, "turn": action.turn})

    async def _continue_turn(self, action: ContinueTurn) -> None:
        gap = (action.resumed_at - action.ended_at) / SAMPLE_RATE
        log.info("turn %d goes on after %.2f s: its answer is dropped", action.turn, gap)
        if self.history and self.history[-1].role == "user":
            self.history.pop()  # the unfinished question is asked again, whole
        assert self._heard is not None
        self._heard.restart(action.resumed_at)
        await self.emit({
            "type": "user_speech_started", "mic_samples": action.resumed_at, "joined": True,
            "turn": action.turn,
        })  # fmt: skip

    async def _end_turn(self, end: EndTurn) -> None:
        decided = time.perf_counter()
        self._cancel(self._partial_task)
        prepared = self._pending.pop(end.end_sample)
        report = TurnReport(
            turn=end.turn, speech_end=self.listener.mic.arrival_of(max(end.start, end.end_sample - 1)),
            rule=end.rule, score=end.score, joined=end.joined,
            speculation="pause" if end.speculated else "none",
        )  # fmt: skip
        report.mark("decision", decided)
        report.dropped_answers, report.dropped_tokens = self.answers.dropped
        self._reports[end.turn] = report
        await self.emit({
            "type": "user_speech_ended", "turn": end.turn, "mic_samples": end.end_sample, "rule": end.rule,
            "score": None if end.score is None else round(end.score, 4),
        })  # fmt: skip
        try:
            text = await prepared.task if prepared.task is not None else ""
        except (asyncio.CancelledError, LipstreamError) as exc:
            log.warning("turn %d: transcription failed: %r", end.turn, exc)
            if isinstance(exc, LipstreamError):  # the recogniser failed: the turn is lost, not the session
                await self.emit({"type": "error", "code": "stt", "message": str(exc), "fatal": False})
            text = ""
        report.mark("transcript", prepared.transcript_at or time.perf_counter())
        if prepared.took_over:
            report.speculation = "resumed"
        if not text:
            prepared.cancel()
            self._reports.pop(end.turn, None)
            self.turns.answer_done()
            audio = self.listener.mic.slice(end.start, end.end_sample)
            rms = float(np.sqrt(np.mean(np.square(audio)))) if audio.size else 0.0
            log.info(
                "turn %d: empty transcript for %.2f s of audio at %.1f dBFS; ignored",
                end.turn, len(audio) / SAMPLE_RATE, 20 * np.log10(max(rms, 1e-9)),
            )  # fmt: skip
            return
        await self.emit({"type": "transcript", "turn": end.turn, "kind": "final", "text": text})
        self.history.append(ChatMessage("user", as_spoken(text)))  # as the model read it
        self._answer, self._replying = prepared, report
        self._reply_task = asyncio.create_task(self._reply(prepared, report), name=f"reply-{end.turn}")
        await self.answers.report_error(prepared)  # it failed while the turn was not yet decided

    async def _reply(self, prepared: PreparedAnswer, report: TurnReport) -> None:
        try:
            if self.seat is not None and not self.seat.seated:
                await self._say_wait(report)
            await self.answers.speak(prepared, report)
        except Exception:  # noqa: BLE001 - a fault ends this answer, not the session; logged, and said
            log.exception("turn %d: the answer failed", report.turn)
            failed = "the answer failed (the server log has the details)"
            await self.emit({"type": "error", "code": "internal", "message": failed, "fatal": False})
        if report.utterance_id is None and report is self._replying:  # nothing was voiced: nothing will play
            self._replying = None
            self.turns.answer_done()
            await self._states_changed()

    async def _say_wait(self, report: TurnReport) -> None:
        """In line for a seat: say so at once (the answer is written once seated), and count the wait."""
        assert self.seat is not None
        started = time.perf_counter()
        if self.seat.reclaim_idle() and self.seat.seated:  # a seat left unused for long was this one's
            return
        try:
            cfg = self.config
            speeches = await self.answers.speaker.speak(cfg.wait_line, cfg.voice, quick_start=True)
            await self.session.push_speech_stream(speeches)
        except LipstreamError as exc:  # the voice failed: the state event still says it
            log.warning("the wait line was not said: %s", exc)
        await self.seat.wait()
        report.waited_ms = round((time.perf_counter() - started) * 1000.0, 1)

    def follow_seat(self) -> None:
        """Once the client knows the session (after `ready`): a `state` event now when in line, and each time
        the line moves (seated, moved up, or sent back to the line after a long idle spell)."""
        if self.seat is not None and self._seat_task is None:
            self._seat_task = asyncio.create_task(self._follow_seat(self.seat))

    async def _follow_seat(self, seat: Seat) -> None:
        moved = seat.watch()
        try:
            await self._states_changed()
            while not seat.released:
                await moved.wait()
                moved.clear()
                await self._states_changed()
        finally:
            seat.unwatch(moved)

    # ---- recognition while the user speaks --------------------------------------------------------------

    def _maybe_partial(self) -> None:
        """Decode the growing turn's undecided tail now and then, committing the words that are stable; when
        a silence begins, the final decode at once (the pause that may end the turn is seen ~64 ms later)."""
        heard = self._heard
        if self.turns.user is UserState.PAUSED or heard is None:  # the pause's answer is being prepared
            return
        mic = self.listener.mic
        silence = int(self._silence_ms * SAMPLE_RATE / 1000)
        if silence:
            # once per silence, never twice at once on the final recogniser (a partial may run beside it)
            if not heard.covers(mic.end - silence) and not heard.final_in_flight():
                final = heard.start_final(mic)
                self._partial_task = asyncio.create_task(self._partial(self.turns.turn, final, final=True))
            return
        if heard.due(mic.end):
            decode = heard.start_partial(mic)
            self._partial_task = asyncio.create_task(self._partial(self.turns.turn, decode))

    async def _partial(self, turn: int, decode: asyncio.Task, final: bool = False) -> None:
        """Show a decode's text, and hand it to the answer maker (notes looked up, the prompt read ahead)."""
        try:
            text = await asyncio.shield(decode)  # the decode may become the final transcript: outlive this
        except LipstreamError as exc:  # the final decode will say so, once, if the recogniser stays down
            log.debug("turn %d: a partial decode failed: %s", turn, exc)
            return
        if not text or turn != self.turns.turn or not self.turns.open:
            return
        await self.emit({"type": "transcript", "turn": turn, "kind": "partial", "text": text})
        heard = self._heard
        speaking = self.turns.user is UserState.SPEAKING and self._silence_ms == 0
        speaking = speaking and not (heard is not None and heard.final_in_flight())
        self.answers.partial_heard(list(self.history), text, may_read=not final and speaking)

    # ---- answering --------------------------------------------------------------------------------------

    async def interrupt(self, continued: bool = False) -> None:
        """Stop the avatar now (the user speaks over it, or pressed Stop): cut the answer and cancel the
        language model; the history keeps what was heard of the answer. `continued`: the user went on with
        the question this answer was for: what was heard of it is not kept, and the turn's figures wait
        for the answer to the whole question."""
        self._cancel(self._reply_task)
        self._reply_task = None
        if self._answer is not None:
            if continued:  # an answer to half a question: its cost is the turn's speculation
                self.answers.drop(self._answer)
            else:
                self._answer.cancel()  # the model stops writing
            self._answer = None
        cut = self.session.interrupt()
        report, self._replying = self._replying, None
        if report is not None and continued:
            self._reports.pop(report.turn, None)  # its playback_finished no longer reports the turn
        elif report is not None and report.utterance_id is not None:
            heard = self.session.heard_text(report.utterance_id, cut)
            if heard:
                self.history.append(ChatMessage("assistant", heard + " ..."))
            report.interrupted = True
            await self._report(report)
        self.turns.answer_done()
        await self._states_changed()

    # ---- the stream going out ---------------------------------------------------------------------------

    async def on_stream_event(self, event: Any) -> dict[str, Any] | None:
        """Called as each session event is sent: what to send for a `text` event (a reply_text), and the
        bookkeeping of the reply's first frame and end."""
        report = self._report_of(event.utterance_id)
        if report is None:
            return None
        if event.type == "speech_started":
            report.mark("first_frame")
            report.first_pts = event.position_samples
            if report is self._replying:
                self.turns.answer_started()
                await self._states_changed()
        elif event.type == "playback_finished":
            # the event goes out with the answer's last frame, up to the session's lead (~1 s) before the
            # listener hears it: until then the avatar still speaks, and speech over it cuts the answer
            ahead = (event.position_samples - self.session.playback_position()) / SAMPLE_RATE
            if report is self._replying and not event.interrupted and ahead > 1 / FPS:
                self._cancel(self._finishing)
                self._finishing = asyncio.create_task(self._finish_when_heard(report, ahead))
            else:
                await self._answer_finished(report, bool(event.interrupted))
        elif event.type == "text":
            message = {
                "type": "reply_text", "turn": report.turn, "utterance_id": event.utterance_id,
                "position_samples": event.position_samples, "text": event.message,
            }  # fmt: skip
            answer = self._answer
            if answer is not None and answer.grounded is not None:
                message["sources"] = list(answer.grounded.sources)
            return message
        return None

    async def _finish_when_heard(self, report: TurnReport, ahead: float) -> None:
        """The answer's end is heard in `ahead` s, unless the user cuts in first (`interrupt` reports it)."""
        await asyncio.sleep(ahead)
        await self._answer_finished(report, interrupted=False)

    async def _answer_finished(self, report: TurnReport, interrupted: bool) -> None:
        """The answer is over (heard to its end, or cut): the history keeps it, its figures are final."""
        if report is self._replying:
            if not interrupted and report.spoken:
                self.history.append(ChatMessage("assistant", " ".join(report.spoken)))
            self._replying = None
            self.turns.answer_done()
            await self._states_changed()
        report.interrupted = report.interrupted or interrupted
        await self._report(report)

    def _report_of(self, utterance_id: int | None) -> TurnReport | None:
        if utterance_id is None:
            return None
        return next((r for r in self._reports.values() if r.utterance_id == utterance_id), None)

    async def _report(self, report: TurnReport) -> None:
        if report.reported:
            return
        report.reported = True
        self._reports.pop(report.turn, None)
        await self.emit(report.as_event())
        if self.observer is not None:
            self.observer.turn_reported(report)

    async def _states_changed(self) -> None:
        """Tell the client (a `state` event) when the avatar's or the user's state, or the conversation's
        place in line for a seat, changed."""
        position = self.seat.position if self.seat is not None else 0
        agent = "waiting" if position else self.turns.agent.value
        states = (agent, self.turns.user.value, position)
        if self.seat is not None and states[:2] != ("listening", "silent"):
            self.seat.touch()  # in use: the seat is not idle
        if states == self._states:
            return
        self._states = states
        event: dict[str, Any] = {"type": "state", "agent": agent, "user": states[1]}
        if position:  # what the avatar says when a turn ends in line, for the page's caption
            event.update(queue_position=position, wait_line=self.config.wait_line)
        await self.emit(event)

    async def aclose(self) -> None:
        """Cancel whatever is in flight."""
        if self._heard is not None:
            self._heard.cancel()
        self.answers.close()
        for task in (self._partial_task, self._reply_task, self._seat_task, self._finishing):
            self._cancel(task)
        if self.seat is not None:
            self.seat.release()  # the next in line is seated
        for prepared in self._pending.values():
            prepared.cancel()
        self.listener.close()
        if self._own_recogniser:
            self.recogniser.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def _cancel(task: asyncio.Task | None) -> None:
        if task is not None and not task.done():
            task.cancel()

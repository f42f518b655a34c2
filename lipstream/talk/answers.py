"""Answer preparation: a turn's transcript -> the language model (streamed) -> sentences -> speech.

An answer is prepared speculatively at a pause (before the end of the turn is confirmed), so recognition
and the model's first tokens hide inside the end-of-turn silence; it is spoken once the turn ends, or
dropped when the user goes on and says something else.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import numpy as np

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.errors import LipstreamError
from lipstream.talk.conversation_types import ConversationConfig, Emit, TurnReport, same_words
from lipstream.talk.hearing.mic_buffer import MicBuffer
from lipstream.talk.hearing.transcriber import LiveTranscription
from lipstream.talk.knowledge.grounding_port import GroundedPrompt, Grounding
from lipstream.talk.models.llm import ChatMessage, LanguageModel, LLMError, ReadsAhead, YieldsCores, as_spoken
from lipstream.talk.seats import Seat
from lipstream.talk.session_port import SessionPort
from lipstream.talk.turn_end import TurnDetector
from lipstream.talk.voices.sentences import SentenceStream, speakable
from lipstream.talk.voices.speaker import Speaker

log = logging.getLogger(__name__)

_END = object()  # end of a model's reply in a PreparedAnswer's queue
# the longest the model waits while the first phrase is synthesised (a long phrase takes ~0.5 s on 2 cores)
FIRST_PHRASE_PAUSE_SECONDS = 1.0
TURN_AUDIO_SAMPLES = 8 * SAMPLE_RATE  # what an audio turn detector hears: the last 8 s


@dataclass
class PreparedAnswer:
    """An answer being prepared for the turn that ends at `end_sample`: its transcript, then the model's
    reply streaming into `deltas`."""

    end_sample: int
    deltas: asyncio.Queue = field(default_factory=asyncio.Queue)  # str, then _END or an LLMError
    task: asyncio.Task | None = None  # transcribes, judges, starts `feeder`; its result is the transcript
    feeder: asyncio.Task | None = None
    text: str = ""  # the transcript the answer was started on
    grounded: GroundedPrompt | None = None  # the passages it was given (None: no knowledge source)
    first_token_at: float | None = None
    transcript_at: float | None = None  # when the transcript was ready (often before the turn is decided)
    judged_at: float | None = None  # when the turn detector's judgement came
    error: LLMError | None = None  # the model failed while writing this answer
    error_reported: bool = False  # ... and the client was told (an `error` event)
    score: float | None = None  # the turn detector's judgement of this pause (None: not judged)
    created_at: float = field(default_factory=time.perf_counter)
    tokens: int = 0  # text deltas the model wrote for it (wasted when it is dropped)
    speaking: bool = False  # the turn ended on it: it is the answer being spoken
    took_over: bool = False  # it continues the model output of an answer set aside at an earlier pause

    def cancel(self) -> None:
        """Drop it (the user went on, or the answer was interrupted)."""
        for task in (self.task, self.feeder):
            if task is not None and not task.done():
                task.cancel()

    def take_over(self, resumed: PreparedAnswer) -> None:
        """Continue the model output of `resumed` (an answer to the same words): its queue, feeder and
        counts."""
        self.deltas, self.feeder, self.grounded = resumed.deltas, resumed.feeder, resumed.grounded
        self.first_token_at, self.tokens, self.error = resumed.first_token_at, resumed.tokens, resumed.error
        resumed.feeder = None  # no longer its to cancel
        self.took_over = True


class AnswerMaker:
    """Writes (the model) and speaks (the speaker, through the session) the answers of one conversation."""

    def __init__(
        self,
        llm: LanguageModel,
        speaker: Speaker,
        session: SessionPort,
        config: ConversationConfig,
        emit: Emit,
        grounding: Grounding | None = None,
        detector: TurnDetector | None = None,
        on_judged: Callable[[int, float], None] | None = None,
        seat: Seat | None = None,
    ) -> None:
        """`detector`: judges pauses (None: the silence rule), beside the answer: it reads the plain prompt
        (no notes) in a context of its own, so a judgement never waits behind an answer or its notes (issue
        47); a text detector reads the question ahead too. `on_judged(end_sample, score)`: told each
        judgement (the turn machine's `judged`). `seat`: the conversation's place on the server
        (lipstream.talk.seats): while it waits in line, the model neither writes nor reads for it."""
        self.llm = llm
        self.speaker = speaker
        self.session = session
        self.config = config
        self.emit = emit
        self.grounding = grounding
        self.detector = detector
        self.on_judged = on_judged
        self.seat = seat
        self.dropped = (0, 0)  # speculative answers dropped since the turn began, and their tokens
        # what reads the prompt while the user speaks: the answer's model (its prompt, the notes included)
        # and the judge (the plain prompt), each once per new text, one read at a time
        self._answer_reader = llm if isinstance(llm, ReadsAhead) else None
        self._judge_reader = detector if isinstance(detector, ReadsAhead) else None
        self._read_last: dict[str, str] = {}  # the user message each reader last read
        self._read_tasks: list[asyncio.Task] = []

    # ---- preparing ------------------------------------------------------------------------------------

    def prepare(
        self, turn: int, end_sample: int, heard: LiveTranscription | None, mic: MicBuffer,
        history: list[ChatMessage], *, judge: bool = False, resumed: PreparedAnswer | None = None,
    ) -> PreparedAnswer:
        """Transcribe the turn up to `end_sample`, have the detector judge that pause (`judge`), then stream
        the model's answer into a queue. An answer set aside at an earlier pause (`resumed`) is taken over
        when the transcript comes out the same: its model output is not thrown away; otherwise dropped."""
        prepared = PreparedAnswer(end_sample=end_sample)
        judge = judge and self.detector is not None
        # an audio detector starts at once, beside the transcription; a text one needs the transcript
        last_audio = mic.slice(end_sample - TURN_AUDIO_SAMPLES) if judge else None
        early = None
        if last_audio is not None and self.detector is not None and not self.detector.needs_text:
            early = asyncio.create_task(self.detector.score(last_audio, []))

        async def run() -> str:
            text = "" if heard is None else await heard.final(mic, end_sample)
            prepared.transcript_at = time.perf_counter()
            prepared.text = text
            if not text:
                return text
            messages = self.messages(prepared, history, text)
            taken_over = resumed is not None and same_words(resumed.text, text) and resumed.feeder is not None
            if resumed is not None and taken_over:
                prepared.take_over(resumed)
            elif resumed is not None:
                self.drop(resumed)
            if not taken_over:  # the judge works beside the answer, on its own context
                self.start(prepared, messages)
            if last_audio is not None:
                judged = plain_prompt(self.config.system_prompt, history, text)
                await self._judge(prepared, turn, last_audio, judged, early)
            return text

        prepared.task = asyncio.create_task(run())
        return prepared

    def drop(self, prepared: PreparedAnswer) -> None:
        """A speculative answer the user talked past (or an answer to half a question): cancelled, its cost
        counted in `dropped` for the turn's figures."""
        prepared.cancel()
        self.dropped = (self.dropped[0] + 1, self.dropped[1] + prepared.tokens)

    async def _judge(
        self, prepared: PreparedAnswer, turn: int, audio: np.ndarray, messages: list[ChatMessage],
        early: asyncio.Task | None,
    ) -> None:
        """The detector's judgement of a pause: sent to the client (`turn_decision`) and to `on_judged`. A
        detector that fails leaves the turn to the hard cap."""
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
        if self.on_judged is not None:
            self.on_judged(prepared.end_sample, score)
        await self.emit({
            "type": "turn_decision", "turn": turn, "finished": finished, "score": round(score, 4),
            "detector": self.detector.name,
        })  # fmt: skip

    def messages(self, prepared: PreparedAnswer, history: list[ChatMessage], text: str) -> list[ChatMessage]:
        """The model's input for the transcript `text`: the system prompt, the history, the question (with
        the passages before it when a knowledge source is given)."""
        messages, grounded = answer_prompt(self.config.system_prompt, history, text, self.grounding)
        prepared.grounded = grounded
        if self.grounding is not None and grounded is not None and not grounded.passages:
            # a decline (or chit-chat: None): the same words every time, synthesised once and kept by the
            # server (a sentence of the notes synthesised ahead was measured and dropped: on 2 cores it slowed
            # the decision and the model as much as it saved)
            if (said := self.grounding.fallback(grounded)) is not None:
                self.speaker.keep(said, self.config.voice)
        return messages

    def read_ahead_prefix(self, history: list[ChatMessage], partial_text: str) -> list[ChatMessage] | None:
        """The answer's prompt as far as the user's words heard so far go: what the model can read while
        they speak. With a knowledge source, up to the question's notes (None: no notes worth reading);
        without one, the question so far (its final words will extend it)."""
        messages, grounded = answer_prompt(self.config.system_prompt, history, partial_text, self.grounding)
        if self.grounding is None:
            return messages
        if grounded is None or not grounded.notes or not grounded.passages:  # nothing worth reading ahead
            return None
        return [*messages[:-1], ChatMessage("user", grounded.notes)]

    def partial_heard(self, history: list[ChatMessage], text: str, *, may_read: bool) -> None:
        """The user's words so far (a decode while they speak): the notes are looked up, and the models
        read the prompt ahead when `may_read`. The conversation says no for the final decode, once a silence
        began (the final decode runs: a read-ahead beside it slowed it) or while the pause's answer is being
        prepared (the judgement reads that prompt next; a read-ahead queued before it only delays it by
        20-67 ms)."""
        if self.grounding is not None:
            self.grounding.prefetch(text)  # retrieval on the partial: the turn pays nothing for it
        if may_read and not self.waiting:
            self.read_ahead(history, text)

    def read_ahead(self, history: list[ChatMessage], partial_text: str) -> None:
        """Have the models read their prompts for what the user has said so far while they still speak: the
        answer's model its prompt (the notes, with a knowledge source), the judge the plain prompt (once per
        new text, one read at a time), so at the end only the last words are left to read (issue 35: a
        question's ~15 tokens cost a judgement ~40-70 ms on one thread). A no-op for models that cannot."""
        if any(not task.done() for task in self._read_tasks):
            return
        reads = (
            ("answer", self._answer_reader, self.read_ahead_prefix(history, partial_text)),
            ("judge", self._judge_reader, plain_prompt(self.config.system_prompt, history, partial_text)),
        )
        self._read_tasks = []
        for name, reader, prefix in reads:
            if reader is None or prefix is None or prefix[-1].content == self._read_last.get(name):
                continue
            self._read_last[name] = prefix[-1].content
            self._read_tasks.append(asyncio.create_task(_prefill(reader, prefix)))

    @property
    def waiting(self) -> bool:
        """The conversation waits for a seat: the shared model is kept for the seated ones."""
        return self.seat is not None and not self.seat.seated

    def close(self) -> None:
        """Stop reading ahead."""
        for task in self._read_tasks:
            task.cancel()

    def start(self, prepared: PreparedAnswer, messages: list[ChatMessage]) -> None:
        """Start the model writing the answer into the prepared queue."""
        prepared.feeder = asyncio.create_task(self._feed(messages, prepared))

    async def _feed(self, messages: list[ChatMessage], prepared: PreparedAnswer) -> None:
        """The model's reply into the prepared queue: text deltas, then _END or the LLMError."""
        try:
            if self.seat is not None:  # in line: the model writes for the seated conversations first
                await self.seat.wait()
            async for delta in self.llm.stream(messages, self.config.max_reply_tokens):
                if prepared.first_token_at is None:
                    prepared.first_token_at = time.perf_counter()
                prepared.tokens += 1
                prepared.deltas.put_nowait(delta)
            prepared.deltas.put_nowait(_END)
        except LLMError as exc:
            prepared.deltas.put_nowait(exc)
            prepared.error = exc
            if prepared.speaking:  # the client hears of it now, not after what was written is played
                await self.report_error(prepared)

    async def report_error(self, prepared: PreparedAnswer) -> None:
        """Send the model's failure on this answer as an `error` event, once."""
        if prepared.error is None or prepared.error_reported:
            return
        prepared.error_reported = True
        log.warning("language model failed: %s", prepared.error)
        await self.emit({"type": "error", "code": "llm", "message": str(prepared.error), "fatal": False})

    async def speak(self, prepared: PreparedAnswer, report: TurnReport) -> None:
        """Speak the prepared answer through the session as one utterance, its stages and sentences kept in
        the turn's `report`."""

        def audio_ready(_speech: object) -> None:
            if report.mark("first_audio"):
                self._model_resumes()

        prepared.speaking = True
        try:
            sentences = self._sentences(prepared, report)
            if self.grounding is not None and prepared.grounded is not None:
                sentences = self.grounding.guard(prepared.grounded, sentences)
            spoken = self._recorded(sentences, prepared, report)
            # quick_start: a first sentence the guard put in whole (the notes' own, not the model's first
            # phrase, which SentenceStream already cut short) is synthesised from its first phrase too
            voice = self.config.voice
            speeches = await self.speaker.speak(spoken, voice, on_speech=audio_ready, quick_start=True)
            await self.session.push_speech_stream(speeches, on_utterance=report.set_utterance)
        except asyncio.CancelledError:
            prepared.cancel()
            raise
        except LipstreamError as exc:  # TTS refused a sentence: the turn ends, the session goes on
            log.warning("turn %d: reply failed: %s", report.turn, exc)
            await self.emit({"type": "error", "code": "llm", "message": str(exc), "fatal": False})
        finally:
            self._model_resumes()

    def _model_yields(self) -> None:
        """The first phrase is being synthesised: a local model stops writing the rest meanwhile, so the
        voice has its core (the phrase's audio lasts longer than the model needs to catch up)."""
        if isinstance(self.llm, YieldsCores):
            self.llm.pause(FIRST_PHRASE_PAUSE_SECONDS)

    def _model_resumes(self) -> None:
        if isinstance(self.llm, YieldsCores):
            self.llm.resume()

    async def _recorded(
        self, sentences: AsyncIterator[str], prepared: PreparedAnswer, report: TurnReport
    ) -> AsyncIterator[str]:
        """The sentences to be spoken, each kept in the report (the history keeps what was spoken, not the
        apology for a failed model), the first one's completion marked."""
        async for sentence in sentences:
            if report.mark("first_phrase"):
                self._model_yields()
            if prepared.error is None or sentence != self.config.apology:
                report.spoken.append(sentence)
            yield sentence

    async def _sentences(self, prepared: PreparedAnswer, report: TurnReport) -> AsyncIterator[str]:
        """The model's reply as speakable sentences, as soon as each is complete (the first one short)."""
        splitter = SentenceStream()
        said_any = False
        while True:
            item = await prepared.deltas.get()
            if prepared.first_token_at is not None:
                report.mark("llm_first_token", prepared.first_token_at)
            if isinstance(item, LLMError):
                prepared.error = item
                await self.report_error(prepared)
                if not said_any and self.config.apology:
                    yield self.config.apology  # not kept in the history: the model did not say it
                return
            pieces = splitter.flush() if item is _END else splitter.push(item)
            for sentence in pieces:
                if spoken := speakable(sentence):
                    said_any = True
                    yield spoken
            if item is _END:
                return


async def _prefill(llm: ReadsAhead, prefix: list[ChatMessage]) -> None:
    try:
        await llm.prefill(prefix)
    except LipstreamError as exc:  # only a head start is lost
        log.debug("reading the prompt ahead failed: %s", exc)


def plain_prompt(system_prompt: str, history: list[ChatMessage], text: str) -> list[ChatMessage]:
    """The prompt without notes: what the turn detector judges (a knowledge turn's notes would only cost it
    their prefill, and the detector's context keeps this prefix from turn to turn)."""
    return [ChatMessage("system", system_prompt), *history, ChatMessage("user", as_spoken(text))]


def answer_prompt(
    system_prompt: str, history: list[ChatMessage], text: str, grounding: Grounding | None
) -> tuple[list[ChatMessage], GroundedPrompt | None]:
    """The model's input for the transcript `text`, and the passages it was given: with a knowledge source,
    the instructions (the same every turn, so a model's prompt cache keeps them and the history) and this
    question's notes in the user's message before the question."""
    question, grounded = as_spoken(text), None
    if grounding is not None:
        grounded = grounding.ground(system_prompt, text)
        system_prompt = grounded.system_prompt
        if grounded.notes:
            system_prompt, question = grounded.instructions, f"{grounded.notes}\n\n{question}"
    return [ChatMessage("system", system_prompt), *history, ChatMessage("user", question)], grounded

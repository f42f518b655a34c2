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

from lipstream.errors import LipstreamError
from lipstream.talk.conversation_types import ConversationConfig, Emit, TurnTimes
from lipstream.talk.grounding_port import GroundedPrompt, Grounding
from lipstream.talk.llm import ChatMessage, LanguageModel, LLMError, ReadsAhead, YieldsCores, as_spoken
from lipstream.talk.sentences import SentenceStream, speakable
from lipstream.talk.session_port import SessionPort
from lipstream.talk.speaker import Speaker

log = logging.getLogger(__name__)

_END = object()  # end of a model's reply in a PreparedAnswer's queue
# the longest the model waits while the first phrase is synthesised (a long phrase takes ~0.5 s on 2 cores)
FIRST_PHRASE_PAUSE_SECONDS = 1.0


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
        judge: object | None = None,
    ) -> None:
        """`judge`: the turn detector; when it reads the prompt through a model of its own (the answers come
        from an endpoint), that model reads ahead too, and the answer need not wait for its judgement."""
        self.llm = llm
        self.speaker = speaker
        self.session = session
        self.config = config
        self.emit = emit
        self.grounding = grounding
        self._read_last = ""  # the user message the models last read ahead
        # the models that read the prompt at the pause: the answer's, and the judge's when it is another
        judge_model = getattr(judge, "model", None)
        models = [llm] if judge_model is llm else [llm, judge_model]
        self._readers: list[ReadsAhead] = [m for m in models if isinstance(m, ReadsAhead)]
        self._read_tasks: list[asyncio.Task] = []
        # the judge reads through the answer's model: it judges first (the turn's end waits for it, and the
        # answer then reads its prompt from the cache); any other judge works beside the answer (issue 35)
        self.answer_first = judge is None or judge_model is not llm

    def messages(self, prepared: PreparedAnswer, history: list[ChatMessage], text: str) -> list[ChatMessage]:
        """The model's input for the transcript `text`: the system prompt, the history, the question (with
        the passages before it when a knowledge source is given). The turn detector reads the same, so the
        model's prompt cache serves both."""
        messages, prepared.grounded = answer_prompt(self.config.system_prompt, history, text, self.grounding)
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

    def read_ahead(self, history: list[ChatMessage], partial_text: str) -> None:
        """Have the model read the answer's prompt for what the user has said so far while they still speak
        (once per partial text or set of notes, one read at a time): at the end only the last words are left
        to read before the turn is judged and the first token written (issue 35: a question's ~15 tokens
        cost the judgement ~40-70 ms on one thread). A no-op for models that cannot read ahead."""
        if not self._readers or any(not task.done() for task in self._read_tasks):
            return
        prefix = self.read_ahead_prefix(history, partial_text)
        if prefix is None or prefix[-1].content == self._read_last:
            return
        self._read_last = prefix[-1].content
        self._read_tasks = [asyncio.create_task(_prefill(model, prefix)) for model in self._readers]

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

    async def speak(
        self, turn: int, prepared: PreparedAnswer, times: TurnTimes, said: list[str],
        on_utterance: Callable[[int], None],
    ) -> None:
        """Speak the prepared answer through the session as one utterance; `said` collects its sentences."""

        def audio_ready(_speech: object) -> None:
            if times.first_audio is None:
                times.first_audio = time.perf_counter()
                self._model_resumes()

        prepared.speaking = True
        try:
            sentences = self._sentences(prepared, times)
            if self.grounding is not None and prepared.grounded is not None:
                sentences = self.grounding.guard(prepared.grounded, sentences)
            spoken = self._recorded(sentences, prepared, times, said)
            speeches = await self.speaker.speak(spoken, self.config.voice, on_speech=audio_ready)
            await self.session.push_speech_stream(speeches, on_utterance=on_utterance)
        except asyncio.CancelledError:
            prepared.cancel()
            raise
        except LipstreamError as exc:  # TTS refused a sentence: the turn ends, the session goes on
            log.warning("turn %d: reply failed: %s", turn, exc)
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
        self, sentences: AsyncIterator[str], prepared: PreparedAnswer, times: TurnTimes, said: list[str]
    ) -> AsyncIterator[str]:
        """The sentences to be spoken, each kept in `said` (the history keeps what was spoken, not the
        apology for a failed model), the first one's completion marked in the turn's times."""
        async for sentence in sentences:
            if times.first_phrase is None:
                times.first_phrase = time.perf_counter()
                self._model_yields()
            if prepared.error is None or sentence != self.config.apology:
                said.append(sentence)
            yield sentence

    async def _sentences(self, prepared: PreparedAnswer, times: TurnTimes) -> AsyncIterator[str]:
        """The model's reply as speakable sentences, as soon as each is complete (the first one short)."""
        splitter = SentenceStream()
        said_any = False
        while True:
            item = await prepared.deltas.get()
            if times.llm_first_token is None and prepared.first_token_at is not None:
                times.llm_first_token = prepared.first_token_at
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

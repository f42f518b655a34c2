"""The conversational agent of a server: speech recognition, the language model and the VAD model, loaded
once at start (before the server says it is ready) and shared by every conversation."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, Field

from lipstream.errors import LipstreamError
from lipstream.talk.conversation import Conversation
from lipstream.talk.conversation_types import (
    ConversationConfig,
    ConversationObserver,
    Emit,
)
from lipstream.talk.hearing.stt import BEAM_SIZE, SpeechToText
from lipstream.talk.hearing.stt_embedded import EmbeddedWhisper
from lipstream.talk.hearing.transcriber import FinalsInFlight
from lipstream.talk.knowledge.persona import Persona
from lipstream.talk.models.llm import ChatMessage, LanguageModel, ReadsAhead, ReportsProcess
from lipstream.talk.seats import (
    DEFAULT_IDLE_SECONDS,
    DEFAULT_MAX_WAITING,
    ConversationSeats,
    default_capacity,
)
from lipstream.talk.session_port import SessionPort
from lipstream.talk.turn_end import EndOfTurnModel, TextTurnDetector, TurnDetector
from lipstream.talk.turn_rule import TurnEndConfig
from lipstream.talk.voices.shared import SharedVoices
from lipstream.talk.voices.speaker import KeptSpeech, Speaker
from lipstream.threads import background_pool

log = logging.getLogger(__name__)

LLM_KEY_ENV = "LIPSTREAM_LLM_KEY"
STT_KEY_ENV = "LIPSTREAM_STT_KEY"


class AgentConfig(BaseModel):
    """What `lipstream serve --agent` was asked for."""

    llm_url: str | None = None  # an OpenAI-compatible endpoint; None: the embedded SmolLM2
    llm_model: str = "default"
    llm_timeout_seconds: float = Field(20.0, gt=0)
    # read each partial transcript into the endpoint's prompt cache while the user speaks (a request of one
    # token each); auto: only an endpoint on this machine, whose reads cost nothing but its own CPU
    llm_read_ahead: Literal["auto", "on", "off"] = "auto"
    # how each conversation listens and answers: its prompt, reply length, history, end-of-turn rule (the
    # server's default: the text detector) and recognition mode; the persona's instructions replace the prompt
    conversation: ConversationConfig = Field(default_factory=lambda: ConversationConfig(turn=TurnEndConfig()))
    echo_cancel: bool = True
    # the recogniser: the bundled Whisper tiny.en, a CTranslate2 Whisper folder of the user's (`stt_model`),
    # or an OpenAI-compatible transcription endpoint (`stt_url`, key from $LIPSTREAM_STT_KEY)
    stt_model: Path | None = None
    stt_url: str | None = None
    stt_url_model: str = "whisper-1"
    # Whisper's encoder on the audio's own window (≥ 5 s, lipstream.talk.hearing.whisper_window) or its fixed
    # 30 s
    stt_window: Literal["audio", "full"] = "audio"
    stt_beam: int = Field(BEAM_SIZE, ge=1, le=10)  # Whisper's beam (1: greedy); see WhisperSTT
    knowledge: Path | None = None  # documents answers come from (--knowledge): indexed at load
    persona: Persona | None = None  # who the avatar is (--persona): instructions, voice, greeting
    # conversations answered at once (None: the machine's measured default, seats.default_capacity) and
    # visitors who may wait for a seat beyond them (more are refused)
    max_conversations: int | None = Field(None, ge=1)
    max_waiting: int = Field(DEFAULT_MAX_WAITING, ge=0)
    seat_idle_seconds: float = Field(DEFAULT_IDLE_SECONDS, gt=0)  # an unused seat goes to a visitor in line


def read_system_prompt(value: str) -> str:
    """`--system-prompt TEXT` or `--system-prompt @file`."""
    if not value.startswith("@"):
        return value
    path = Path(value[1:]).expanduser()
    try:
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise LipstreamError(f"cannot read the system prompt file {path}: {exc.strerror}") from None
    if not text:
        raise LipstreamError(f"the system prompt file {path} is empty")
    return text


@dataclass
class AgentServices:
    """The loaded models; `conversation()` makes one Conversation per session."""

    config: AgentConfig
    stt: SpeechToText
    llm: LanguageModel
    vad_model: Any  # silero-vad's loaded model (no public type), shared by the sessions' detectors
    partial_stt: SpeechToText | None = None  # partial transcripts on their own model (None: `stt`)
    detector: TurnDetector | None = None  # judges the user's pauses (None: the silence rule)
    turn_model: Any = None  # a SmolLM2 process started only to judge turns (answers come from an endpoint)
    # transcription threads shared by the server's conversations: off the sessions' speech pool, two so a
    # final transcript never waits behind a partial one; at the frame work's own priority, not nicer: the
    # transcript is on the answer's critical path, and a busy server starved it (issue 35)
    recogniser: Executor = field(default_factory=lambda: background_pool(2, "lipstream-stt", niceness=0))
    # answers are synthesised at the frame work's priority too, not on the sessions' nicer speech pool: the
    # first phrase's audio is on the answer's critical path (issue 35: Piper took ~350 ms for it, starved)
    answer_voice: Executor = field(
        default_factory=lambda: background_pool(2, "lipstream-answer-voice", niceness=0)
    )
    # ... by voices of their own that keep onnxruntime's memory arena: answers come in sentences of at most
    # 240 characters, and in a busy server each synthesis without the arena took ~50k page faults, ~1.5x
    # its CPU time alone (first phrase -> audio p50 194 -> 124 ms; docs/conversation.md)
    answer_voices: SharedVoices = field(default_factory=lambda: SharedVoices(keep_arena=True))
    # sentences every conversation says alike (a persona's unknown answer), synthesised once for all of them
    kept_speech: KeptSpeech = field(default_factory=dict)
    knowledge: Any = None  # the KnowledgeBase over config.knowledge (None: answers from the model alone)
    seats: ConversationSeats | None = None  # the conversations answered at once (None: no limit)
    # the final transcripts being decoded for any conversation: partial decodes wait for them
    finals: FinalsInFlight = field(default_factory=FinalsInFlight)

    @property
    def greeting(self) -> str | None:
        """What the persona says when a Talk session starts (None: nothing)."""
        return self.config.persona.greeting if self.config.persona is not None else None

    @property
    def voice(self) -> str | None:
        """The persona's voice (None: the server's)."""
        return self.config.persona.voice if self.config.persona is not None else None

    def conversation(
        self, session: SessionPort, emit: Emit, voice: str | None = None, speaker: Speaker | None = None,
        observer: ConversationObserver | None = None, seat_size: float = 1.0,
    ) -> Conversation:
        """A conversation over `session`, with its own VAD state and echo canceller; its answers are spoken by
        the services' answer voices (in `voice`, the persona's, or `speaker`'s default) and transcribed on
        the services' recogniser threads; `observer` hears of each turn's figures (the server's metrics).
        It takes a seat of `seat_size` (seats.seat_size) or a place in line; raises SeatsFull when the server
        cannot take one more."""
        seat = self.seats.take(seat_size) if self.seats is not None else None
        cfg = self.config.conversation.model_copy(update={"voice": voice})
        if self.detector is None:  # no detector loaded: the plain silence rule
            cfg = cfg.model_copy(update={"turn": TurnEndConfig(detector="silence")})
        if self.config.persona is not None:  # its instructions and voice (a voice asked for wins)
            cfg = self.config.persona.apply(cfg)
            cfg = cfg.model_copy(update={"voice": voice}) if voice else cfg
        vad = cfg.voice_activity(self.vad_model)
        echo = _echo_canceller(self.config)
        default_voice = speaker.default_voice if speaker is not None else "piper"
        speaker = Speaker(self.answer_voices, executor=self.answer_voice, default_voice=default_voice,
                          kept=self.kept_speech)  # fmt: skip
        # the voice loads (the first time: ~0.3 s) while the user says the first question
        self.answer_voice.submit(self._load_voice, cfg.voice or default_voice)
        return Conversation(
            session, self.stt, self.llm, emit, cfg, vad=vad, echo=echo, partial_stt=self.partial_stt,
            speaker=speaker, recogniser=self.recogniser, detector=self.detector, observer=observer, seat=seat,
            finals=self.finals,
            **self._grounding(),
        )  # fmt: skip

    def _load_voice(self, name: str) -> None:
        try:
            self.answer_voices(name)
        except LipstreamError as exc:  # said again, to the user, when an answer is spoken in it
            log.warning("the answer voice %r did not load: %s", name, exc)

    def _grounding(self) -> dict[str, Any]:
        """`grounding=` for a new conversation: its own KnowledgeGrounding over the shared index."""
        if self.knowledge is None:
            return {}
        from lipstream.talk.knowledge.grounding import KnowledgeGrounding

        return {"grounding": KnowledgeGrounding(self.knowledge, self.config.persona)}

    def knowledge_status(self) -> dict[str, Any] | None:
        """The knowledge index and the persona, for /healthz (None: neither)."""
        body: dict[str, Any] = {}
        if self.knowledge is not None:
            stats = self.knowledge.stats()
            body["knowledge"] = {"documents": stats.documents, "chunks": stats.chunks,
                                 "age_seconds": round(stats.age_seconds())}  # fmt: skip
        if self.config.persona is not None:
            body["persona"] = {"name": self.config.persona.name, "greeting": self.config.persona.greeting}
        return body or None

    def turn_status(self) -> dict[str, Any]:
        """The end-of-turn rule in use, for /healthz."""
        turn = self.config.conversation.turn
        if self.detector is None:
            return {"detector": "silence", "silence_ms": self.config.conversation.end_silence_ms}
        return {"detector": self.detector.name, **turn.model_dump(exclude={"detector"})}

    def seat_status(self) -> dict[str, int] | None:
        """Conversations answered now, waiting and refused, for /healthz (None: no limit)."""
        return self.seats.counts().as_dict() if self.seats is not None else None

    def model_status(self) -> dict[str, Any] | None:
        """The embedded language model process's state and restarts (None for an HTTP endpoint)."""
        return self.llm.status().as_dict() if isinstance(self.llm, ReportsProcess) else None

    async def aclose(self) -> None:
        """Close the language model's connections (and stop the embedded model's process)."""
        self.recogniser.shutdown(wait=False, cancel_futures=True)
        self.answer_voice.shutdown(wait=False, cancel_futures=True)
        if isinstance(self.stt, EmbeddedWhisper):  # the final and partial recognisers are that one child
            await asyncio.to_thread(self.stt.close)
        for model in (self.llm, self.turn_model):
            close = getattr(model, "aclose", None)
            if close is not None:
                await close()


def _echo_canceller(config: AgentConfig) -> Any:
    if not config.echo_cancel:
        return None
    from lipstream.talk.hearing.echo import EchoCanceller

    return EchoCanceller()


def _turn_detector(turn: TurnEndConfig, llm: Any) -> tuple[TurnDetector | None, Any]:
    """The configured turn detector, and the model started only for it (to be closed with the agent)."""
    if turn.detector == "smart-turn":
        from lipstream.talk.hearing.smart_turn import SmartTurnModel
        from lipstream.talk.turn_end import SmartTurnDetector

        return SmartTurnDetector(SmartTurnModel(), background_pool(1, "lipstream-turn")), None
    if turn.detector != "text":
        return None, None
    if isinstance(llm, EndOfTurnModel):  # the embedded model judges turns too, sharing its KV cache
        return TextTurnDetector(llm), None
    from lipstream.talk.models.llm_embedded import EmbeddedChatModel

    try:  # answers come from an endpoint: a SmolLM2 process of its own judges turns
        judge = EmbeddedChatModel()
    except LipstreamError as exc:  # no model file here: the plain silence rule, said loudly
        log.error("the text turn detector cannot run (%s); turns end after plain silence", exc)
        return None, None
    try:
        judge.warm_up()
    except LipstreamError as exc:
        log.error("%s; turns end after %.0f ms of silence", exc, turn.max_wait_ms)
    return TextTurnDetector(judge), judge


def _warm_judge(detector: TextTurnDetector, system_prompt: str) -> None:
    messages = [ChatMessage("system", system_prompt), ChatMessage("user", "Hello")]
    try:
        asyncio.run(detector.score(np.zeros(0, np.float32), messages))
    except LipstreamError as exc:
        log.error("the text turn detector could not warm up: %s", exc)


def _warm_answers(llm: ReadsAhead, system_prompt: str) -> None:
    """Read the answers' system message into the model's cache at start (a knowledge turn's instructions and
    rule: ~100 tokens, ~0.7 s on one core, that a server's first answer read before its first word; an
    answer seated beside a sequence holding them copies them: llm_batch.MIN_COPY_TOKENS)."""
    try:
        asyncio.run(llm.prefill([ChatMessage("system", system_prompt), ChatMessage("user", "")]))
    except LipstreamError as exc:
        log.warning("the answers' system prompt was not read ahead: %s", exc)


def _recognisers(config: AgentConfig, context: str = "") -> tuple[SpeechToText, SpeechToText]:
    """The final-transcript and partial recognisers: an endpoint (one client serves both), or Whisper's
    child process (it serves both too), told `context` (the persona's greeting and the notes' names)."""
    if config.stt_url:
        from lipstream.talk.hearing.stt_openai import OpenAITranscriber

        remote = OpenAITranscriber(config.stt_url, config.stt_url_model, api_key=os.environ.get(STT_KEY_ENV))
        return remote, remote
    # Whisper in a process of its own: inside the server's it took 1.5-3x its time alone (the GIL; see
    # docs/conversation.md). Two decodes at once (a final beside a partial), one thread each: on 2 cores one
    # thread decodes as fast as two. Started now; `load_agent` waits for it after starting the model too.
    whisper = EmbeddedWhisper(
        config.stt_model, threads=1, workers=2, window=config.stt_window, context=context,
        beam=config.stt_beam,
    )
    return whisper, whisper


def load_agent(config: AgentConfig) -> AgentServices:
    """Load and warm speech recognition, the language model and the VAD (seconds; done before `ready`)."""
    from lipstream.talk.hearing.vad import SileroModel

    started = time.perf_counter()
    knowledge = None
    if config.knowledge is not None:  # bad documents are refused now, before any model loads
        from lipstream.talk.knowledge.index import KnowledgeBase

        knowledge = KnowledgeBase(config.knowledge)
        stats = knowledge.stats()
        log.info("knowledge: %d documents, %d chunks (%s)", stats.documents, stats.chunks, stats.index)
    # the final transcript is on the answer's critical path: two decodes at once, never behind a partial
    from lipstream.talk.knowledge.grounding import listening_context

    stt, partial_stt = _recognisers(config, listening_context(knowledge, config.persona))
    if config.llm_url:
        from lipstream.talk.models.llm_openai import OpenAIChatModel, ReadingAheadChatModel, is_loopback

        reads_ahead = config.llm_read_ahead == "on" or (
            config.llm_read_ahead == "auto" and is_loopback(config.llm_url)
        )
        llm: Any = (ReadingAheadChatModel if reads_ahead else OpenAIChatModel)(
            config.llm_url, config.llm_model, api_key=os.environ.get(LLM_KEY_ENV) or None,
            timeout=config.llm_timeout_seconds,
        )
    else:
        from lipstream.talk.models.llm_embedded import EmbeddedChatModel

        llm = EmbeddedChatModel()  # its own process, started now, loading while Whisper loads here
        try:
            llm.warm_up()
        except LipstreamError as exc:  # the server still serves; each turn says the model is unavailable
            log.error("%s; conversations will answer that the language model is unavailable", exc)
    if isinstance(stt, EmbeddedWhisper):  # its child loaded beside the model's
        stt.warm_up()
    detector, turn_model = _turn_detector(config.conversation.turn, llm)
    prompt = config.persona.system_prompt() if config.persona else config.conversation.system_prompt
    if isinstance(detector, TextTurnDetector):  # the system prompt's KV cache, so a first judgement is quick
        _warm_judge(detector, prompt)
    if isinstance(llm, ReadsAhead):  # ... and the answers' fixed start, so a first answer reads its own words
        if knowledge is not None:
            from lipstream.talk.knowledge.grounding import KnowledgeGrounding

            prompt = KnowledgeGrounding(knowledge, config.persona).instructions(prompt)
        _warm_answers(llm, prompt)
    services = AgentServices(
        config=config, stt=stt, llm=llm, vad_model=SileroModel(), partial_stt=partial_stt, detector=detector,
        turn_model=turn_model, knowledge=knowledge,
        seats=ConversationSeats(
            config.max_conversations or default_capacity(), config.max_waiting, config.seat_idle_seconds
        ),
    )
    log.info("agent ready in %.1f s (%s)", time.perf_counter() - started, getattr(llm, "name", "llm"))
    return services

"""The conversational agent of a server: speech recognition, the language model and the VAD model, loaded
once at start (before the server says it is ready) and shared by every conversation."""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from lipstream.errors import LipstreamError
from lipstream.talk.conversation import Conversation
from lipstream.talk.conversation_types import DEFAULT_SYSTEM_PROMPT, ConversationConfig, Emit
from lipstream.talk.llm import LanguageModel
from lipstream.talk.session_port import AvatarSession
from lipstream.talk.speaker import Speaker
from lipstream.talk.stt import SpeechToText
from lipstream.threads import background_pool

log = logging.getLogger(__name__)

LLM_KEY_ENV = "LIPSTREAM_LLM_KEY"


class AgentConfig(BaseModel):
    """What `lipstream serve --agent` was asked for."""

    llm_url: str | None = None  # an OpenAI-compatible endpoint; None: the embedded SmolLM2
    llm_model: str = "default"
    llm_timeout_seconds: float = Field(20.0, gt=0)
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    max_reply_tokens: int = Field(120, ge=8, le=1024)
    max_history_messages: int = Field(12, ge=0, le=200)
    end_silence_ms: float = Field(500, ge=100, le=5000)
    echo_cancel: bool = True


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
    # transcription threads shared by the server's conversations: off the sessions' speech pool, two so a
    # final transcript never waits behind a partial one; nicer than frame work, like the speech pool
    recogniser: Executor = field(default_factory=lambda: background_pool(2, "lipstream-stt"))

    def conversation(
        self, session: AvatarSession, emit: Emit, voice: str | None = None, speaker: Speaker | None = None
    ) -> Conversation:
        """A conversation over `session`, with its own VAD state and echo canceller; its answers are spoken
        by `speaker` (the server's voices) and transcribed on the services' recogniser threads."""
        from lipstream.talk.vad import VoiceActivityDetector

        cfg = ConversationConfig(
            system_prompt=self.config.system_prompt,
            max_reply_tokens=self.config.max_reply_tokens,
            max_history_messages=self.config.max_history_messages,
            end_silence_ms=self.config.end_silence_ms,
            voice=voice,
        )
        vad = VoiceActivityDetector(
            start_ms=cfg.start_ms, end_silence_ms=cfg.end_silence_ms, pause_ms=cfg.pause_ms,
            model=self.vad_model,
        )
        echo = _echo_canceller(self.config)
        return Conversation(
            session, self.stt, self.llm, emit, cfg, vad=vad, echo=echo, partial_stt=self.partial_stt,
            speaker=speaker, recogniser=self.recogniser,
        )  # fmt: skip

    def model_status(self) -> dict[str, Any] | None:
        """The embedded language model process's state and restarts (None for an HTTP endpoint)."""
        status = getattr(self.llm, "status", None)
        return status().as_dict() if callable(status) else None

    async def aclose(self) -> None:
        """Close the language model's connections (and stop the embedded model's process)."""
        self.recogniser.shutdown(wait=False, cancel_futures=True)
        close = getattr(self.llm, "aclose", None)
        if close is not None:
            await close()


def _echo_canceller(config: AgentConfig) -> Any:
    if not config.echo_cancel:
        return None
    from lipstream.talk.echo import EchoCanceller

    return EchoCanceller()


def load_agent(config: AgentConfig) -> AgentServices:
    """Load and warm speech recognition, the language model and the VAD (seconds; done before `ready`)."""
    from lipstream.talk.stt import WhisperSTT
    from lipstream.talk.vad import SileroModel

    started = time.perf_counter()
    # the final transcript is on the answer's critical path: two threads, its own model; partials (shown
    # while the user speaks) on a one-thread model beside it, so a final never waits for a partial
    stt = WhisperSTT(cpu_threads=2, workers=1)
    partial_stt = WhisperSTT(cpu_threads=1, workers=1)
    if config.llm_url:
        from lipstream.talk.llm_openai import OpenAIChatModel

        llm: Any = OpenAIChatModel(
            config.llm_url, config.llm_model, api_key=os.environ.get(LLM_KEY_ENV) or None,
            timeout=config.llm_timeout_seconds,
        )
    else:
        from lipstream.talk.llm_embedded import EmbeddedChatModel

        llm = EmbeddedChatModel()  # its own process, started now, loading while Whisper loads here
        try:
            llm.warm_up()
        except LipstreamError as exc:  # the server still serves; each turn says the model is unavailable
            log.error("%s; conversations will answer that the language model is unavailable", exc)
    services = AgentServices(
        config=config, stt=stt, llm=llm, vad_model=SileroModel(), partial_stt=partial_stt
    )
    log.info("agent ready in %.1f s (%s)", time.perf_counter() - started, getattr(llm, "name", "llm"))
    return services

"""A conversation over the fake parts of talk_fakes.py, driven as a server would: the microphone pushed in
20 ms chunks, the session's stream events delivered once an utterance is "played". Shared by the
conversation tests (test_turns.py, test_conversation_prompts.py)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
from talk_fakes import (
    CHUNK,
    LevelVAD,
    PlainSTT,
    RecordingSession,
    ScriptedLLM,
    ScriptedSTT,
    ToneVoice,
    silence,
    spoken,
)

from lipstream.talk.conversation import Conversation
from lipstream.talk.conversation_types import ConversationConfig
from lipstream.talk.voices.speaker import Speaker


@dataclass
class Run:
    """One conversation over fakes, and what came out of it."""

    conversation: Conversation
    session: RecordingSession
    stt: ScriptedSTT
    llm: ScriptedLLM
    events: list[dict] = field(default_factory=list)
    played: set[int] = field(default_factory=set)  # utterances whose stream events were delivered

    def kinds(self, kind: str) -> list[dict]:
        """The events of one type."""
        return [e for e in self.events if e["type"] == kind]


def make(
    config: ConversationConfig | None = None, detector=None, stt=None, grounding=None, llm=None
) -> Run:
    """A conversation over the fakes (call inside a running loop)."""
    session, llm = RecordingSession(), llm or ScriptedLLM()
    stt = stt or ScriptedSTT()
    events: list[dict] = []

    async def emit(message: dict) -> None:
        events.append(message)

    config = config or ConversationConfig(start_ms=100, partial_every_seconds=0.3)
    # commits from the first words: these turns are short, and commitment is what is tested
    config = config.model_copy(update={"streaming_recognition": True, "commit_after_seconds": 0.0})
    vad = LevelVAD(config.start_ms, config.pause_ms, config.vad_end_silence_ms)
    conversation = Conversation(
        session, stt, llm, emit, config, vad=vad, speaker=Speaker(voices=lambda _name: ToneVoice()),
        detector=detector, grounding=grounding,
    )  # fmt: skip
    return Run(conversation, session, stt.inner if isinstance(stt, PlainSTT) else stt, llm, events)


def question(words: str, after: float = 0.8) -> np.ndarray:
    """A spoken question between a short silence and `after` seconds of silence."""
    return np.concatenate([silence(0.3), spoken(words), silence(after)])


async def say(run: Run, audio: np.ndarray, settle: float = 0.02) -> None:
    """Push audio as the microphone in 20 ms chunks, letting the loop run in between (decodes finish)."""
    for i in range(0, len(audio), CHUNK):
        await run.conversation.push_microphone(audio[i : i + CHUNK], 16000)
        await asyncio.sleep(0.0005)
    await asyncio.sleep(settle)


async def finish(run: Run) -> None:
    """Let the answer be spoken and played (the session's events, as a server's stream sends them), then
    close."""
    for _ in range(200):
        if run.session.said and not run.conversation.answering:
            break
        await asyncio.sleep(0.01)
    await play(run)
    await run.conversation.aclose()


async def play(run: Run) -> None:
    """Deliver each recorded utterance's stream events to the conversation: its first frame, its sentences'
    captions, its end; the messages it returns (reply_text) join the run's events."""
    for uid, sentences in enumerate(run.session.said, start=1):
        if uid in run.played:
            continue
        run.played.add(uid)
        events = [("speech_started", ""), *(("text", s) for s in sentences), ("playback_finished", "")]
        for kind, text in events:
            event = SimpleNamespace(
                type=kind, utterance_id=uid, position_samples=0, message=text, interrupted=False
            )
            if (message := await run.conversation.on_stream_event(event)) is not None:
                run.events.append(message)

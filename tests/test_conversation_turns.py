"""The Conversation object in-process (issue 9): a real Session on the small avatar, Whisper, the OpenAI
client against a local SSE server, the silero VAD; microphone audio pushed faster than real time. Covers the
turn rules a live test would need minutes for: a monologue cut at the turn limit and answered, and the
history after an answer."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from fake_llm_server import FakeLLMServer

from lipstream.engines.registry import create_engine
from lipstream.render.session import RenderSession, SessionConfig
from lipstream.talk.conversation import Conversation
from lipstream.talk.conversation_types import ConversationConfig
from lipstream.talk.hearing.stt import WhisperSTT
from lipstream.talk.models.llm_openai import OpenAIChatModel

pytestmark = pytest.mark.slow

ANSWER = "That is a long story. Thank you for telling it."


@pytest.fixture(scope="module")
def stt() -> WhisperSTT:
    """The bundled Whisper tiny.en, loaded once."""
    return WhisperSTT()


async def relay_events(session: RenderSession, conversation: Conversation, events: list[dict]) -> None:
    """What a connection does with the session's stream: its events through the conversation (captions,
    turn figures), frames dropped."""
    async for item in session:
        if not hasattr(item, "pts"):
            extra = await conversation.on_stream_event(item)
            if extra is not None:
                events.append(extra)


async def settle_and_close(
    conversation, session, llm, consumer: asyncio.Task, events: list[dict], settle: float
) -> None:
    """Wait up to `settle` s for the answer's turn_metrics, then close everything."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settle
    while loop.time() < deadline and not any(e["type"] == "turn_metrics" for e in events):
        await asyncio.sleep(0.1)
    await conversation.aclose()
    consumer.cancel()
    await session.aclose()
    await llm.aclose()


async def converse(
    avatar, stt, audio: np.ndarray, config: ConversationConfig, settle: float
) -> tuple[list, Conversation]:
    """Push `audio` as the microphone (20 ms chunks, no pacing), let the answer play out; the events."""
    events: list[dict] = []

    async def emit(message: dict) -> None:
        events.append(message)

    engine = create_engine("viseme")
    async with FakeLLMServer(ANSWER) as llm_server:
        llm = OpenAIChatModel(llm_server.url, "fake")
        session = RenderSession(avatar, engine, SessionConfig(encode=False))
        await session.start()
        conversation = Conversation(session, stt, llm, emit, config)
        consumer = asyncio.create_task(relay_events(session, conversation, events))
        pcm = np.clip(audio * 32767, -32768, 32767).astype(np.int16)
        for i in range(0, len(pcm), 320):
            await conversation.push_microphone(pcm[i : i + 320], 16000)
            await asyncio.sleep(0)
        await settle_and_close(conversation, session, llm, consumer, events, settle)
    return events, conversation


def test_a_monologue_is_cut_at_the_turn_limit_and_answered(small_avatar, stt) -> None:
    from lipstream.talk.voices.tts import create_tts

    speech = create_tts("piper").synthesize(
        "I want to tell you about my trip to the mountains last summer, when we walked for days along the "
        "river and slept under the stars every night, and the weather was kind to us the whole time."
    ).pcm
    audio = np.concatenate([np.zeros(8000, np.float32), speech, speech, np.zeros(16000, np.float32)])
    config = ConversationConfig(max_turn_seconds=4.0)
    events, conversation = asyncio.run(converse(small_avatar, stt, audio, config, settle=30))
    kinds = [e["type"] for e in events]
    assert kinds.count("user_speech_started") == 1  # the rest of the monologue is not a second turn
    ended = [e for e in events if e["type"] == "user_speech_ended"]
    assert ended and ended[0]["mic_samples"] <= 8000 + 4.2 * 16000  # cut at the 4 s limit, not at the end
    finals = [e for e in events if e["type"] == "transcript" and e["kind"] == "final"]
    assert finals and "mountains" in finals[0]["text"].lower()
    assert any(e["type"] == "reply_text" for e in events), kinds
    assert any(e["type"] == "turn_metrics" for e in events)
    # the history holds the question and the answer as spoken
    roles = [m.role for m in conversation.history]
    assert roles[:2] == ["user", "assistant"], roles
    assert "long story" in conversation.history[1].content.lower()

"""A conversation's answers are spoken by voices of their own that keep onnxruntime's memory arena."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from talk_fakes import RecordingSession  # noqa: E402

from lipstream.talk.agent import AgentConfig, AgentServices
from lipstream.talk.voices.shared import SharedVoices

pytestmark = pytest.mark.slow  # loads Piper twice


def _keeps_arena(voices: SharedVoices) -> bool:
    voice = voices("piper")
    staged = voice._staged  # the voice in two stages (piper_stages): both sessions keep it, or neither
    sessions = [voice._voice.session] if staged is None else [staged.text_side, staged.frames_side]
    kept = {session.get_session_options().enable_cpu_mem_arena for session in sessions}
    assert len(kept) == 1
    return kept.pop()


def test_answer_voices_keep_the_arena_and_sound_the_same_as_the_servers() -> None:
    server, answers = SharedVoices(), SharedVoices(keep_arena=True)
    assert not _keeps_arena(server) and _keeps_arena(answers)
    text = "The largest planet in our solar system is Jupiter."
    said = [voices("piper").synthesize(text) for voices in (server, answers)]
    assert np.array_equal(said[0].pcm, said[1].pcm) and said[0].phonemes == said[1].phonemes


def test_a_conversation_speaks_with_the_answer_voices_loaded_when_it_starts() -> None:
    services = AgentServices(config=AgentConfig(echo_cancel=False), stt=None, llm=None, vad_model=None)

    async def emit(message: dict) -> None:
        pass

    async def main() -> None:
        conversation = services.conversation(RecordingSession(), emit)
        speaker = conversation.answers.speaker
        assert speaker.voices is services.answer_voices and speaker.executor is services.answer_voice
        await conversation.aclose()

    asyncio.run(main())
    # the voice loads on the answer pool as the conversation starts, without an answer asking for it
    deadline = time.monotonic() + 30
    while "piper" not in services.answer_voices._voices and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "piper" in services.answer_voices._voices and _keeps_arena(services.answer_voices)

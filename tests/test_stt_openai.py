"""A user's own recogniser behind an OpenAI-compatible transcription endpoint: the real client
(lipstream.talk.hearing.stt_openai) against a local stand-in that speaks the same protocol (multipart WAV in,
verbose_json with word timings out) and transcribes with the bundled Whisper; the streaming recogniser
commits words from it; bad answers are clear errors."""

from __future__ import annotations

import io
import socket
import threading
import time
import wave
from collections.abc import Iterator
from typing import Annotated

import numpy as np
import pytest
from fastapi import FastAPI, File, Form, UploadFile
from fastapi.responses import JSONResponse

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.errors import ModelError
from lipstream.talk.hearing.stt import WhisperSTT, WordTimingSpeechToText, word_error_rate
from lipstream.talk.hearing.stt_openai import OpenAITranscriber, transcriptions_url
from lipstream.talk.hearing.transcriber import TurnRecogniser

pytestmark = pytest.mark.slow  # a server thread and a Whisper load

QUESTION = "What time does the library open on Saturday morning?"


def _standin_app(stt: WhisperSTT, seen: list[dict]):
    """FastAPI app: POST /v1/audio/transcriptions as OpenAI's API answers it (verbose_json, words)."""
    app = FastAPI()

    @app.post("/v1/audio/transcriptions")
    async def transcriptions(
        file: Annotated[UploadFile, File()], model: Annotated[str, Form()],
        prompt: Annotated[str, Form()] = "", response_format: Annotated[str, Form()] = "json",
    ) -> JSONResponse:
        seen.append({"model": model, "prompt": prompt, "format": response_format})
        if model == "broken":
            return JSONResponse({"error": {"message": "model not loaded"}}, status_code=503)
        with wave.open(io.BytesIO(await file.read())) as wav:
            pcm = np.frombuffer(wav.readframes(wav.getnframes()), "<i2").astype(np.float32) / 32768.0
        result = stt.transcribe_words(pcm, prompt)
        if model == "text-only":
            return JSONResponse({"text": result.text})
        words = [{"word": w.strip(), "start": a, "end": b} for w, a, b in result.words]
        return JSONResponse({"text": result.text, "words": words, "duration": len(pcm) / SAMPLE_RATE})

    return app


@pytest.fixture(scope="module")
def standin() -> Iterator[tuple[str, list[dict]]]:
    """The stand-in server on a free local port: (base URL, the requests it saw)."""
    import uvicorn

    seen: list[dict] = []
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(_standin_app(WhisperSTT(), seen), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1", seen
    server.should_exit = True
    thread.join(5)


@pytest.fixture(scope="module")
def question() -> np.ndarray:
    from lipstream.talk.voices.tts import create_tts

    # Piper's voice: espeak-ng's, decoded in streaming pieces by tiny.en, read the question's last words as
    # "The Nonsense Day More Again" on an AMD EPYC (and passed on a Xeon): the client and protocol are what
    # this module tests; recognition quality on espeak-ng is conversation's and stt_window's to measure
    return create_tts("piper").synthesize(QUESTION).pcm


def test_transcriptions_url_accepts_a_base_or_the_full_path() -> None:
    assert transcriptions_url("http://h:1") == "http://h:1/v1/audio/transcriptions"
    assert transcriptions_url("http://h:1/v1/") == "http://h:1/v1/audio/transcriptions"
    with pytest.raises(ModelError, match="http"):
        transcriptions_url("h:1")


def test_the_client_transcribes_with_word_timings_through_the_endpoint(standin, question) -> None:
    url, seen = standin
    client = OpenAITranscriber(url, "standin", timeout=120)
    assert isinstance(client, WordTimingSpeechToText)
    result = client.transcribe_words(question, prompt="Hello.")
    assert word_error_rate(QUESTION, result.text) <= 0.3, result.text
    assert result.words and result.words[0][1] <= result.words[-1][1]
    assert seen[-1] == {"model": "standin", "prompt": "Hello.", "format": "verbose_json"}


def test_streaming_recognition_commits_words_from_the_endpoint(standin, question) -> None:
    url, _ = standin
    client = OpenAITranscriber(url, "standin", timeout=120)
    recog = TurnRecogniser(client, client, turn_start=0, whole_turn_seconds=0.0)  # commits at once
    for end in range(SAMPLE_RATE // 2, len(question), SAMPLE_RATE // 2):
        start = recog.audio_from()
        recog.partial(question[start:end], start)
    start = recog.audio_from()
    assert recog.state.committed and start > 0
    final = recog.final(question[start:], start)
    assert word_error_rate(QUESTION, final) <= 0.3, final


def test_an_endpoint_that_gives_text_only_still_transcribes_whole_turns(standin, question) -> None:
    url, _ = standin
    client = OpenAITranscriber(url, "text-only", timeout=120)
    recog = TurnRecogniser(client, client, 0)
    partial = recog.partial(question[: SAMPLE_RATE], 0)
    assert not recog.state.committed and recog.audio_from() == 0
    assert isinstance(partial, str)
    assert word_error_rate(QUESTION, recog.final(question, 0)) <= 0.3


def test_a_failing_endpoint_is_a_clear_error(standin, question) -> None:
    url, _ = standin
    with pytest.raises(ModelError, match="503.*model not loaded"):
        OpenAITranscriber(url, "broken", timeout=120).transcribe(question)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    with pytest.raises(ModelError, match="did not answer"):
        OpenAITranscriber(f"http://127.0.0.1:{closed}", "x", timeout=2).transcribe(question)

"""LLM providers: the OpenAI-compatible client against a real local SSE server, and the embedded model."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from lipstream.errors import LipstreamError
from lipstream.talk.models.llm import ChatMessage, LanguageModel, LLMError, ReadsAhead
from lipstream.talk.models.llm_embedded import READ_AHEAD_TIMEOUT_S
from lipstream.talk.models.llm_openai import (
    OpenAIChatModel,
    ReadingAheadChatModel,
    chat_completions_url,
    is_loopback,
)

sys.path.insert(0, str(Path(__file__).parent))
from fake_llm_server import DEFAULT_TEXT, FakeLLMServer  # noqa: E402

QUESTION = [
    ChatMessage("system", "You are a friendly assistant. Answer in one short sentence."),
    ChatMessage("user", "What is the capital of France?"),
]


async def _collect(model: LanguageModel, messages: list[ChatMessage], max_tokens: int = 64) -> list[str]:
    return [delta async for delta in model.stream(messages, max_tokens=max_tokens)]


def test_url_forms() -> None:
    assert chat_completions_url("http://h:1") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert chat_completions_url("https://h/v1/chat/completions") == "https://h/v1/chat/completions"
    with pytest.raises(LLMError):
        chat_completions_url("h:1")


def test_streams_deltas_and_reuses_one_connection() -> None:
    async def main() -> None:
        async with FakeLLMServer() as server:
            model = OpenAIChatModel(server.url + "/v1", "fake-ok", api_key="k", timeout=5)
            assert isinstance(model, LanguageModel)
            try:
                first = await _collect(model, QUESTION)
                second = await _collect(model, QUESTION)
            finally:
                await model.aclose()
            assert len(first) > 5  # word by word, not one blob
            assert "".join(first) == DEFAULT_TEXT == "".join(second)
            assert server.stats.requests == 2 and server.stats.completed == 2
            assert server.stats.connections == 1  # the second turn reused the first turn's connection
            body = server.stats.bodies[0]
            assert body["stream"] is True and body["max_tokens"] == 64
            assert body["messages"][0] == {"role": "system", "content": QUESTION[0].content}

    asyncio.run(main())


def test_an_endpoint_on_this_machine_reads_the_question_ahead_for_one_token() -> None:
    assert is_loopback("http://127.0.0.1:8080/v1") and is_loopback("http://localhost:11434")
    assert is_loopback("http://[::1]:8000/v1") and is_loopback("http://127.3.0.1/v1")
    assert not is_loopback("https://api.openai.com/v1") and not is_loopback("http://10.0.0.5:8000")
    assert not isinstance(OpenAIChatModel("http://127.0.0.1:1", "m"), ReadsAhead)  # each read costs a request

    async def main() -> None:
        async with FakeLLMServer() as server:
            model = ReadingAheadChatModel(server.url, "m", timeout=5)
            assert isinstance(model, ReadsAhead)
            heard = [QUESTION[0], ChatMessage("user", "What time does the")]
            try:
                await model.prefill(heard)
                answer = await _collect(model, QUESTION)
            finally:
                await model.aclose()
            read, asked = server.stats.bodies
            assert read["max_tokens"] == 1 and read["messages"] == [m.to_dict() for m in heard]
            assert server.stats.completed == 2 and server.stats.connections == 1
            assert asked["max_tokens"] == 64 and "".join(answer) == DEFAULT_TEXT

    asyncio.run(main())


def test_max_tokens_bounds_the_reply() -> None:
    async def main() -> None:
        async with FakeLLMServer() as server:
            model = OpenAIChatModel(server.url, "m", timeout=5)
            try:
                deltas = await _collect(model, QUESTION, max_tokens=3)
            finally:
                await model.aclose()
            assert len(deltas) == 3

    asyncio.run(main())


@pytest.mark.parametrize(
    ("mode", "needle"),
    [
        ("http500", "HTTP 500"),
        ("http401", "HTTP 401 (check LIPSTREAM_LLM_KEY)"),
        ("garbage", "not server-sent events"),
        ("badjson", "invalid JSON"),
        ("truncate", "failed"),
    ],
)
def test_failures_raise_one_line_llm_error(mode: str, needle: str) -> None:
    async def main() -> None:
        async with FakeLLMServer() as server:
            model = OpenAIChatModel(server.url, f"fake-{mode}", timeout=5)
            try:
                with pytest.raises(LLMError) as info:
                    await _collect(model, QUESTION)
                # The client is still usable for the next turn.
                ok = OpenAIChatModel(server.url, "fake-ok", timeout=5)
                assert "".join(await _collect(ok, QUESTION)) == DEFAULT_TEXT
                await ok.aclose()
            finally:
                await model.aclose()
            message = str(info.value)
            assert needle in message and "\n" not in message
            assert isinstance(info.value, LipstreamError)

    asyncio.run(main())


def test_refused_connection_is_llm_error() -> None:
    async def main() -> None:
        server = FakeLLMServer()
        await server.start()
        url = server.url
        await server.stop()  # nothing listens on that port any more
        model = OpenAIChatModel(url, "m", timeout=2)
        try:
            with pytest.raises(LLMError, match="ConnectError"):
                await _collect(model, QUESTION)
        finally:
            await model.aclose()

    asyncio.run(main())


def test_stall_times_out() -> None:
    async def main() -> None:
        async with FakeLLMServer(mode="stall") as server:
            model = OpenAIChatModel(server.url, "m", timeout=0.5)
            started = time.perf_counter()
            try:
                with pytest.raises(LLMError, match="timed out after 0.5 s"):
                    await _collect(model, QUESTION)
            finally:
                await model.aclose()
            assert time.perf_counter() - started < 3

    asyncio.run(main())


def test_cancellation_stops_the_stream_at_the_server() -> None:
    async def main() -> None:
        async with FakeLLMServer(mode="slow") as server:
            model = OpenAIChatModel(server.url, "m", timeout=5)
            got: list[str] = []

            async def consume() -> None:
                async for delta in model.stream(QUESTION):
                    got.append(delta)

            task = asyncio.create_task(consume())
            while not got:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            deadline = time.perf_counter() + 2
            while server.stats.aborted == 0 and time.perf_counter() < deadline:
                await asyncio.sleep(0.02)
            assert server.stats.aborted == 1 and server.stats.completed == 0
            assert len(got) < 4
            # And the client works for the next turn.
            fast = OpenAIChatModel(server.url, "fake-ok", timeout=5)
            assert "".join(await _collect(fast, QUESTION)) == DEFAULT_TEXT
            await fast.aclose()
            await model.aclose()

    asyncio.run(main())


@pytest.fixture(scope="session")
def embedded():
    """The embedded SmolLM2 model in its supervised process, started once for the whole test session.

    A crash of llama.cpp ends that process and fails these tests with the model's error, not the run."""
    from lipstream.talk.models.llm_embedded import EmbeddedChatModel

    model = EmbeddedChatModel(threads=1)
    model.warm_up()
    yield model
    asyncio.run(model.aclose())


@pytest.mark.slow
def test_embedded_model_answers_in_english(embedded) -> None:
    async def main() -> list[str]:
        return await _collect(embedded, QUESTION, max_tokens=40)

    deltas = asyncio.run(main())
    reply = "".join(deltas)
    assert len(deltas) > 3 and len(reply.split()) >= 3
    assert "<|im_end|>" not in reply and "<|im_start|>" not in reply
    assert sum(ch.isascii() for ch in reply) / len(reply) > 0.9  # English text, not byte soup
    assert embedded.load_seconds < 10


@pytest.mark.slow
def test_embedded_model_cancellation_stops_generation(embedded) -> None:
    async def main() -> None:
        got: list[str] = []

        async def consume() -> None:
            long_question = QUESTION[:1] + [ChatMessage("user", "Tell me a very long story about a dragon.")]
            async for delta in embedded.stream(long_question, max_tokens=400):
                got.append(delta)

        task = asyncio.create_task(consume())
        while len(got) < 3:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The worker stops within a token: the lock is free again almost at once, and the next turn runs.
        started = time.perf_counter()
        reply = await _collect(embedded, QUESTION, max_tokens=8)
        assert reply and time.perf_counter() - started < 5
        assert len(got) < 50

    asyncio.run(main())


@pytest.mark.slow
def test_embedded_model_runs_in_a_keyed_local_process(embedded) -> None:
    import httpx

    endpoint = embedded.process.wait_ready(30)
    assert endpoint is not None and endpoint.pid != os.getpid() and endpoint.url.startswith("http://127.0.0.1:")
    assert httpx.get(endpoint.url + "/health", timeout=5).status_code == 401  # no key: refused
    wrong = {"Authorization": "Bearer " + "x" * 43}
    assert httpx.get(endpoint.url + "/health", headers=wrong, timeout=5).status_code == 401
    right = {"Authorization": f"Bearer {endpoint.key}"}
    health = httpx.get(endpoint.url + "/health", headers=right, timeout=5).json()
    assert health["pid"] == endpoint.pid
    bad = httpx.post(endpoint.url + "/v1/chat/completions", headers=right, json={"messages": []}, timeout=5)
    assert bad.status_code == 400 and "bad request" in bad.json()["error"]["message"]


@pytest.mark.slow
def test_embedded_model_crash_mid_answer_is_an_llm_error_and_the_next_turn_is_answered(embedded) -> None:
    """SIGSEGV in the model process while it answers: the turn fails with a message naming the crash, the
    caller's process lives on, and a new model process answers the next turn within seconds."""
    restarts_before = embedded.status().restarts
    long_question = QUESTION[:1] + [ChatMessage("user", "Tell me a very long story about a dragon.")]

    async def crash_then_ask() -> tuple[list[str], float]:
        got: list[str] = []
        with pytest.raises(LLMError) as failed:
            async for delta in embedded.stream(long_question, max_tokens=400):
                got.append(delta)
                if len(got) == 3:
                    os.kill(embedded.status().pid, signal.SIGSEGV)
        assert "died mid-answer (killed by SIGSEGV)" in str(failed.value)
        crashed = time.perf_counter()
        reply = await _collect(embedded, QUESTION, max_tokens=8)
        assert reply
        return got, time.perf_counter() - crashed

    got, recovery_seconds = asyncio.run(crash_then_ask())
    assert 3 <= len(got) < 50
    assert recovery_seconds < 10  # restart (0.25 s backoff) + load + warm-up; the goal is 5 s (benchmark)
    status = embedded.status()
    assert status.restarts == restarts_before + 1 and status.last_exit == "killed by SIGSEGV"


@pytest.mark.slow
def test_a_model_that_died_between_turns_answers_the_next_turn_without_error(embedded) -> None:
    """Killed while idle: the next turn waits for the successor instead of failing on the dead port."""
    endpoint = embedded.process.wait_ready(30)
    assert endpoint is not None
    os.kill(endpoint.pid, signal.SIGKILL)
    reply = asyncio.run(_collect(embedded, QUESTION, max_tokens=8))
    assert reply and embedded.status().pid not in (None, endpoint.pid)


@pytest.mark.slow
def test_a_judgement_does_not_wait_for_an_answer_being_written(embedded) -> None:
    """The judge has its own context in the model's process (issue 47): a turn judged while another answer
    is being written comes back while that answer is still streaming."""

    async def main() -> tuple[int, int, float]:
        got: list[str] = []

        async def consume() -> None:
            story = QUESTION[:1] + [ChatMessage("user", "Tell me a very long story about a dragon.")]
            async for delta in embedded.stream(story, max_tokens=300):
                got.append(delta)

        task = asyncio.create_task(consume())
        while len(got) < 3:
            await asyncio.sleep(0.005)
        score = await embedded.end_of_turn([*QUESTION[:1], ChatMessage("user", "What time is it?")])
        when_judged = len(got)
        await task
        return when_judged, len(got), score

    when_judged, written, score = asyncio.run(main())
    assert 0 < score <= 1
    assert when_judged < written, (when_judged, written)  # the answer was still being written


@pytest.mark.slow
def test_an_answer_asked_during_a_long_read_ahead_is_written_before_the_read_ends(embedded) -> None:
    """A long read-ahead (a knowledge turn's notes, ~650 tokens) gives way to another conversation's answer
    asked meanwhile: the answer is written while the notes are still being read, which then go on."""
    notes = " ".join(f"Note {i}: the room on floor {i % 4} opens at {8 + i % 3} am." for i in range(40))
    prefix = [*QUESTION[:1], ChatMessage("user", notes)]

    async def main() -> tuple[dict, list[str], bool]:
        # the read's own timeout, as `prefill` gives it (~4 s here; a loaded box takes 2-3 times that)
        read = asyncio.create_task(embedded._post("read_ahead", prefix, timeout=READ_AHEAD_TIMEOUT_S))
        await asyncio.sleep(0.3)  # the read is under way
        reply = await _collect(embedded, QUESTION, max_tokens=8)
        still_reading = not read.done()
        return await read, reply, still_reading

    read, reply, still_reading = asyncio.run(main())
    assert reply and still_reading
    assert read["tokens"] > 600, read  # read to the end

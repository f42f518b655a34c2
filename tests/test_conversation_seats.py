"""Issue 49: several visitors at once. A real `serve --agent` process (2 seats, 1 place in line), visitors
asking different spoken questions (espeak-ng) at the same time, answered by a language model that repeats the
question it was given (the fake endpoint's echo mode): every reply is its own question's, none crossed; a
visitor beyond the seats is told to wait (a `state` event, the wait line) and answered once a seat frees;
one beyond the line is refused with a clear error; /healthz and /metrics count them."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import server_harness as harness
import websockets
from server_harness import ServerProcess, agent_with_fake_llm, talk_until, write_speech_wav

from lipstream.server.converse_client import ConverseReport, run_converse
from lipstream.talk.conversation_types import same_words

pytestmark = pytest.mark.slow
avatars_root = harness.avatars_root  # shared fixtures

QUESTIONS = {
    "weather": "What will the weather be like tomorrow?",
    "library": "When does the library open?",
    "station": "Where is the train station?",
}


@pytest.fixture(scope="module")
def seated_server(avatars_root: Path) -> Iterator[ServerProcess]:
    """Two conversations answered at once, one visitor in line; the silence rule ends turns."""
    seats = ("--max-conversations", "2", "--max-waiting", "1")
    yield from agent_with_fake_llm(avatars_root, ("--mode", "echo"), *seats)


@pytest.fixture(scope="module")
def questions(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each question as a WAV: 0.5 s of silence, the question, 0.3 s of silence."""
    from lipstream.talk.voices.tts import create_tts

    tts, folder = create_tts("espeak"), tmp_path_factory.mktemp("questions")
    paths = {}
    for key, text in QUESTIONS.items():
        paths[key] = write_speech_wav(folder / f"{key}.wav", tts.synthesize(text).pcm, lead_samples=8000)
    return paths


def _words(text: str) -> set[str]:
    return {w.strip(".,?!").lower() for w in text.split()}


def _own_reply(report: ConverseReport, key: str) -> None:
    """The transcript is this visitor's question (it shares more words with it than with any other: Whisper
    tiny may mishear a word, "weather" as "winner"), and the reply repeats that transcript and no other."""
    heard = report.final_transcript or ""
    shared = {k: len(_words(heard) & _words(q)) for k, q in QUESTIONS.items()}
    assert max(shared, key=shared.__getitem__) == key, (key, heard, shared)
    assert same_words(report.reply, f"You asked: {heard}"), (key, report.reply, heard)
    others = [k for k in QUESTIONS if k != key and k in report.reply.lower()]
    assert not others, (key, report.reply)


def test_simultaneous_questions_each_get_their_own_answer(
    seated_server: ServerProcess, questions: dict[str, Path]
) -> None:
    async def main() -> list[ConverseReport]:
        return await asyncio.gather(*(
            run_converse(seated_server.ws, "small", questions[key], timeout=30)
            for key in ("weather", "library")
        ))  # fmt: skip

    for _round in range(2):  # twice: the second round's sessions reuse the server's seats
        reports = asyncio.run(main())
        for key, report in zip(("weather", "library"), reports, strict=True):
            _own_reply(report, key)
            assert not report.waited and report.turn_metrics is not None
            assert report.turn_metrics["waited_ms"] is None


async def _hold_seat(url: str, seated: asyncio.Event, leave: asyncio.Event) -> None:
    """A Talk session that keeps its seat until `leave` is set."""
    async with websockets.connect(url, max_size=None) as ws:
        await talk_until(ws, "ready")
        seated.set()
        while not leave.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ws.recv(), 0.2)


async def _refused(url: str) -> tuple[dict, int | None]:
    """A visitor beyond the seats and the line: the error message and the close code."""
    async with websockets.connect(url, max_size=None) as ws:
        await ws.send(json.dumps({"type": "hello", "version": 1, "avatar": "small", "agent": True}))
        error = json.loads(await asyncio.wait_for(ws.recv(), 30))
        with contextlib.suppress(websockets.ConnectionClosed):
            await asyncio.wait_for(ws.recv(), 10)
        return error, ws.close_code


def test_a_visitor_beyond_the_seats_waits_is_told_and_is_answered_when_a_seat_frees(
    seated_server: ServerProcess, questions: dict[str, Path]
) -> None:
    url = seated_server.ws

    async def main() -> tuple[ConverseReport, tuple[dict, int | None], dict, str]:
        leave_first, leave_second = asyncio.Event(), asyncio.Event()
        seated = [asyncio.Event(), asyncio.Event()]
        holders = [
            asyncio.create_task(_hold_seat(url, seated[0], leave_first)),
            asyncio.create_task(_hold_seat(url, seated[1], leave_second)),
        ]
        await asyncio.wait_for(asyncio.gather(*(s.wait() for s in seated)), 30)
        waiting = asyncio.create_task(run_converse(url, "small", questions["station"], timeout=30))
        await asyncio.sleep(1.0)  # the visitor is in line now: one more is refused
        refused = await _refused(url)
        async with httpx.AsyncClient() as http:
            health = (await http.get(f"{seated_server.http}/healthz")).json()
        await asyncio.sleep(3.0)  # the question (~2 s) is over and the wait line said: a seat frees
        leave_first.set()
        report = await waiting
        async with httpx.AsyncClient() as http:
            metrics = (await http.get(f"{seated_server.http}/metrics")).text
        leave_second.set()
        await asyncio.gather(*holders)
        return report, refused, health, metrics

    report, (error, close_code), health, metrics = asyncio.run(main())
    log = seated_server.log_lines("lipstream", 0)[-3000:]
    assert error["type"] == "error" and error["code"] == "busy" and error["fatal"] is True, error
    assert "2 conversation(s) at once" in error["message"] and "try again" in error["message"], error
    assert close_code == 1013
    assert health["conversations"] == {
        "capacity": 2, "active": 2, "waiting": 1, "refused": 1, "max_waiting": 1, "taken": 2.0,
    }, health  # fmt: skip
    # told to wait: in line first, a state after the question's end, the wait line heard before the answer
    assert report.waited and report.queue_positions[0] == 1, (report.queue_positions, log)
    assert report.speech_end_to_wait_seen_ms is not None, log
    assert report.speech_end_to_wait_heard_ms is not None, log
    assert report.speech_end_to_first_frame_ms is not None
    assert report.speech_end_to_wait_heard_ms < report.speech_end_to_first_frame_ms
    _own_reply(report, "station")
    assert report.turn_metrics is not None and report.turn_metrics["waited_ms"] > 1000, report.turn_metrics
    assert "lipstream_conversations_refused 1.0" in metrics
    assert "lipstream_conversations_capacity 2.0" in metrics

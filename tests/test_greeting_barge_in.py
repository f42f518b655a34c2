"""Issue 47: the persona's greeting can be talked over in every Talk session of a server. The reference
client (`client --converse`) asks a spoken question (espeak-ng) while the greeting plays, in a real
`serve --agent --persona` process's second and third sessions: the question is heard, transcribed and
answered. (The greeting is synthesised once, when the server starts, so every session's greeting starts at
once; before issue 47 the first 3 s of one could not be talked over by a microphone that does not hear the
avatar.)"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import server_harness as harness
import websockets
from server_harness import ServerProcess, agent_with_fake_llm, talk_until, write_speech_wav

from lipstream.server.converse_client import ConverseReport, run_converse

pytestmark = [pytest.mark.slow, pytest.mark.realtime]  # the greeting plays in real time as it is talked over
avatars_root = harness.avatars_root  # shared fixtures

REPLY = "Yes, the printers are on the first floor."
GREETING = (
    "Hello, I am Ada, the assistant of the Riverside Library. I can tell you about our opening hours, our "
    "reading rooms, the children's corner and the events of this month. What would you like to know?"
)
# the question starts this long after the session's microphone does: the greeting plays by then, and the
# question is over before the greeting has been audible for 3 s
LEAD_SECONDS = 1.0


@pytest.fixture(scope="module")
def persona_server(avatars_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A real agent server with a greeting persona (the default Piper voice), answering with the fake language
    model; the silence rule ends turns, so no turn-judging model is started."""
    persona = tmp_path_factory.mktemp("persona") / "ada.toml"
    persona.write_text(f'name = "Ada"\ngreeting = "{GREETING}"\n')
    yield from agent_with_fake_llm(avatars_root, ("--text", REPLY), "--persona", str(persona))


@pytest.fixture(scope="module")
def question(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short spoken question (espeak-ng) that Whisper tiny.en reads right however the turn is cut: "Can I
    print documents here?" in 16 of 16 cuts (0.05-0.4 s before it, 0.2-0.9 s after), where "Can I borrow a
    bicycle?" was read right in 2 ("Can I minimize it all?", "Can I am I, is it cool?": the suite's failures).
    "When do you open on Sunday?" was taken for the greeting's echo by the delay search at one of 19 offsets
    (docs/protocol.md: such a start stays held)."""
    from lipstream.talk.voices.tts import create_tts

    speech = create_tts("espeak").synthesize("Can I print documents here?").pcm
    path = tmp_path_factory.mktemp("question") / "question.wav"
    write_speech_wav(path, speech, lead_samples=int(LEAD_SECONDS * 16000))
    return path


async def _greeted_session(url: str) -> None:
    """A Talk session that stays until its greeting starts playing (its voice is then loaded)."""
    async with websockets.connect(url, max_size=None) as ws:
        await talk_until(ws, "speech_started")


def _events(report: ConverseReport, kind: str) -> list[tuple[float, dict]]:
    return [(e.at_ms, e.message) for e in report.events if e.message.get("type") == kind]


def test_a_question_over_the_greeting_is_heard_in_every_session(
    persona_server: ServerProcess, question: Path
) -> None:
    url = f"ws://127.0.0.1:{persona_server.port}/ws"
    asyncio.run(_greeted_session(url))  # the server's first session
    for session in (2, 3):
        since = len(persona_server.stderr)
        report = asyncio.run(run_converse(url, "small", question, timeout=20))
        log = persona_server.log_lines("lipstream.talk", since)
        greeting_at, greeting = _events(report, "speech_started")[0]
        heard_at, _ = _events(report, "user_speech_started")[0]
        # asked over the greeting: it was playing before the question began, and the question cut it
        assert greeting_at < LEAD_SECONDS * 1000, (session, greeting_at)
        cut = [(at, m) for at, m in _events(report, "playback_finished")
               if m["utterance_id"] == greeting["utterance_id"]]  # fmt: skip
        # the barge-in interrupts in the step that starts the turn (talk/turns.py: Interrupt, then StartTurn),
        # so the greeting's playback_finished may arrive a moment before user_speech_started (0.07 ms once)
        assert cut and cut[0][1]["interrupted"] and cut[0][0] >= heard_at - 20, (session, cut, heard_at, log)
        words = {w.strip(".,?!").lower() for w in (report.final_transcript or "").split()}
        assert "print" in words, (session, report.final_transcript, log)
        assert report.reply == REPLY and report.turn_metrics is not None, (session, report.reply, log)
        assert report.turn_metrics["turn"] == 1 and report.interrupted is False

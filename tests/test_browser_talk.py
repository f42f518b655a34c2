"""The page's Talk mode in headless Chromium with a real microphone stream, against `lipstream serve --agent`.

Chromium's fake capture device plays a WAV (a spoken question made with the bundled Piper voice) as the
microphone; the language model is tests/fake_llm_server.py (first token at once), so what is timed is
lipstream.
"""

from __future__ import annotations

import re
import wave
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import server_harness as harness
from server_harness import FakeLLMProcess, ServerProcess, run_browser_script

pytestmark = [pytest.mark.slow, pytest.mark.browser]
avatars_root = harness.avatars_root  # shared fixtures
live_server = harness.live_server
RATE = 16000

# long enough (~3.5 s) that partial transcripts (every ~0.5 s of the growing turn) show before the end
QUESTION = "Could you please tell me the name of the capital city of France?"
SECOND_QUESTION = "Wait, stop, tell me about the weather in London instead."
ANSWER = (
    "Paris is the capital of France. It lies on the river Seine, in the north of the country. "
    "Millions of people visit its museums, its parks and its cafes every single year. "
    "In the spring the chestnut trees along its wide avenues flower, and the evenings are long and light. "
    "Many visitors walk along the river at night, when the bridges and the old buildings are lit."
)


def write_mic_wav(path: Path, *parts: str | float) -> dict[str, float]:
    """A 16 kHz 16-bit WAV of silences (float s) and Piper-spoken texts; returns each text's onset in s."""
    from lipstream.talk.voices.tts import create_tts

    tts = create_tts("piper")
    chunks: list[np.ndarray] = []
    onsets: dict[str, float] = {}
    at = 0
    for part in parts:
        if isinstance(part, str):
            pcm = np.asarray(tts.synthesize(part).pcm, dtype=np.float32)
            onsets[part] = at / RATE
        else:
            pcm = np.zeros(round(part * RATE), dtype=np.float32)
        chunks.append(pcm)
        at += len(pcm)
    audio = np.concatenate(chunks)
    audio = audio / max(1e-6, float(np.abs(audio).max())) * 0.7  # a normal speaking level, no clipping
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(RATE)
        out.writeframes((audio * 32767).astype("<i2").tobytes())
    return onsets


@pytest.fixture(scope="module")
def mic_wavs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The microphone files. Each ends in long silence: Chromium loops the file, the scenario ends before."""
    root = tmp_path_factory.mktemp("mic")
    talk, barge = root / "question.wav", root / "barge_in.wav"
    write_mic_wav(talk, 1.0, QUESTION, 20.0)
    # The second question starts 11 s after the first ends. The answer must have been audible for 3 s by then
    # (after that the echo gate stops holding speech starts for a microphone that does not hear the avatar,
    # this fake one; a start held earlier is dropped if the question ends first) and still be playing. The
    # answer begins 2-5 s after the question (turn judged, or the detector's 3 s cap, + transcript + first
    # sentence; over 5 s under the full suite, where the barge-in was then never heard) and lasts ~20 s,
    # so any start up to 8 s works; with 8 s and a 9 s answer, a start after 5 s lost the barge-in.
    write_mic_wav(barge, 1.0, QUESTION, 11.0, SECOND_QUESTION, 20.0)
    return {"talk": talk, "barge_in": barge}


@pytest.fixture(scope="module")
def fake_llm() -> Iterator[str]:
    """tests/fake_llm_server.py in a process: streams ANSWER to every request, first token at once."""
    llm = FakeLLMProcess("--text", ANSWER)
    yield llm.url
    llm.stop()


@pytest.fixture(scope="module")
def agent_server(avatars_root: Path, fake_llm: str) -> Iterator[ServerProcess]:
    """A real `lipstream serve --agent` whose language model is the fake server; turns judged by the default
    text detector (its own SmolLM2 process), with a hard cap above a loaded machine's transcript time."""
    server = ServerProcess(avatars_root, "--agent", "--llm-url", fake_llm, "--turn-max-wait-ms", "3000")
    yield server
    server.stop()


def drive(options: dict, timeout: float = 120) -> dict:
    """Run tests/browser/talk.mjs with these options; its one JSON line."""
    return run_browser_script("talk.mjs", options, timeout)


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def caption_lag_ms(caption: dict) -> float:
    """How long after its position on the audio clock a caption was shown."""
    return (caption["clock"] - caption["position"]) / (RATE / 1000)


def test_talk_mode_transcript_captions_and_stop(
    agent_server: ServerProcess, mic_wavs: dict[str, Path]
) -> None:
    # the microphone as Opus (?mic=opus, protocol 1.4); the barge-in test below keeps the default, PCM
    wav = str(mic_wavs["talk"])
    result = drive({"url": agent_server.http, "scenario": "talk", "wav": wav, "mic": "opus"})
    assert result["problems"] == [], result["problems"]
    snap = result["snap"]
    assert snap["decodeErrors"] == 0 and snap["audioState"] == "running"
    assert result["micRate"] in (16000, 44100, 48000)
    # the microphone goes up as Opus (this Chromium's AudioEncoder encodes it): at most 24
    # kbit/s of packets plus 22 bytes of framing per 20 ms (8.8 kbit/s), against 16 bits × the capture rate
    # as PCM (768 kbit/s at 48 kHz)
    mic_kbit = snap["micBytesSent"] * 8 / 1000 / result["micSeconds"]
    assert snap["micCodec"] == "opus" and 5 < mic_kbit < 50, (snap["micCodec"], mic_kbit)
    assert result["talkVisible"] and not result["micButtonVisible"], "Talk replaces the Microphone button"

    # the user's words as they speak: a partial shown (in partial style), then replaced by the final one
    transcripts = result["probe"]["transcripts"]
    partials = [t for t in transcripts if t["kind"] == "partial" and t["text"].strip()]
    finals = [t for t in transcripts if t["kind"] == "final"]
    assert partials, transcripts
    assert partials[0]["domPartial"] is True and partials[0]["domText"] == partials[0]["text"].strip()
    assert finals and finals[0]["at"] > partials[0]["at"]
    assert {"capital", "france"} <= words(finals[0]["text"]), finals[0]["text"]
    user_lines = [li for li in result["conversation"] if "user" in li["cls"].split()]
    assert user_lines[0]["text"] == finals[0]["text"].strip() and "partial" not in user_lines[0]["cls"]

    # the answer as captions, in order, each shown on the audio clock while speech frames are on screen
    captions = result["probe"]["captions"]
    assert len(captions) >= 2
    spoken = " ".join(c["text"].strip() for c in captions)  # sentences or clauses, as the server split them
    assert ANSWER.startswith(spoken), (spoken, ANSWER)
    for c in captions:
        assert c["captionShown"], c
        assert 0 <= caption_lag_ms(c) < 100, c
        assert c["speakingLater"] is True and c["shownPtsLater"] >= c["position"], c
    started = [e for e in snap["events"] if e["type"] == "speech_started"]
    assert started and captions[0]["position"] >= started[0]["position_samples"]

    # Stop: the avatar stops at once, and no speech frame comes after
    assert snap["interruptMs"] is not None and snap["interruptMs"] < 300, snap["interruptMs"]
    assert result["speechStable"]
    finished = [e for e in snap["events"] if e["type"] == "playback_finished"]
    assert finished and finished[-1]["interrupted"] is True
    assert result["caption"] == ""
    metrics = [e for e in snap["events"] if e["type"] == "turn_metrics"]
    assert metrics and result["turns"], "the turn log shows the turn's timings"
    # ... and draws its stages as a waterfall, in order, one bar for each stage the server reported
    reported = [stage for stage, value in metrics[0]["ms"].items() if value is not None]
    assert result["waterfalls"] and result["waterfalls"][-1] == reported, (result["waterfalls"], reported)

    # the turn machine's states, shown as they change: the user speaks and pauses, the avatar thinks, then
    # speaks its answer, and listens again once Stop cut it
    states = result["probe"]["states"]
    assert all(s["shown"] == f"avatar {s['agent']} · you {s['user']}" for s in states), states
    agents = [s["agent"] for s in states]
    assert "paused" in [s["user"] for s in states] and agents[-1] == "listening", states
    assert "thinking" in agents and agents.index("speaking") > agents.index("thinking"), states

    # the end-of-turn detector's judgement, shown live, and the rule that ended the turn in the turn log
    decisions = result["probe"]["decisions"]
    assert decisions and decisions[-1]["finished"] is True and decisions[-1]["detector"] == "text", decisions
    assert decisions[-1]["micState"] == "your turn is over"
    # the detector's rule, or its cap when a loaded machine transcribes for longer than the cap
    assert metrics[0]["end_rule"] in ("detector", "max_wait"), metrics[0]
    assert result["turns"][0][0].endswith(metrics[0]["end_rule"].replace("_", " ")), result["turns"]
    print(
        "caption lag ms:", [round(caption_lag_ms(c), 1) for c in captions], "mic kbit/s:", round(mic_kbit, 1),
        "stop->last speech frame ms:", round(snap["interruptMs"]), "turn ms:", metrics[0]["ms"],
    )  # fmt: skip


def barge_in_ms(server_http: str, wav: Path) -> dict:
    """The benchmark's barge-in figure: user speech onset -> last avatar speech frame shown in the browser.

    `ms` takes the onset where the server's VAD put it (`user_speech_started.mic_samples`, mapped back to the
    page's capture clock); `level_ms` takes it where the page's own mic level first rose (the WAV is silent
    before the question, so that is the true onset)."""
    result = drive({"url": server_http, "scenario": "barge_in", "wav": str(wav)})
    return {"ms": result["bargeInMs"], "level_ms": result["bargeInLevelMs"], "result": result}


@pytest.mark.realtime  # its clock is checked: it runs with no other worker's test beside it
def test_barge_in_stops_the_avatar(agent_server: ServerProcess, mic_wavs: dict[str, Path]) -> None:
    figure = barge_in_ms(agent_server.http, mic_wavs["barge_in"])
    result = figure["result"]
    assert result["problems"] == [], result["problems"]
    assert result["snap"]["decodeErrors"] == 0
    assert result["bargeInBreakdown"], "the second question cut the answer (playback_finished interrupted)"
    print("barge-in ms (VAD onset, level onset):", round(figure["ms"]), round(figure["level_ms"] or -1),
          result["bargeInBreakdown"])  # fmt: skip
    # The goal is 300 ms; it measures ~275-340 ms here: 200 ms of speech before the VAD may call it speech,
    # ~40-70 ms more until the server's cut reaches the page, then the frames still due before the cut
    # (~30-70 ms). The bench reports the figure; the test leaves a loaded 2-core machine room, so that it
    # fails on a real regression (a barge-in that waits for the end of the sentence is > 1 s) only. Under
    # the full suite one run in a few stalls to 440-550 ms (2 of 7 runs here; 275-340 ms otherwise; CI's
    # machine measured 482-544 ms twice in a row, half of it in the server's VAD and cut, half in frames
    # still shown after the cut): a slow run is measured again, and a regression is over 700 ms twice.
    if not _quick(figure):
        print("slow barge-in, measured again:", figure["ms"], figure["level_ms"])
        figure = barge_in_ms(agent_server.http, mic_wavs["barge_in"])
    assert _quick(figure), figure


def _quick(figure: dict) -> bool:
    """The barge-in was under 700 ms from both onsets (the server's VAD and the page's own mic level)."""
    return figure["ms"] is not None and figure["ms"] < 700 and figure["level_ms"] is not None and (
        figure["level_ms"] < 700
    )


def test_refused_or_absent_microphone_is_said(agent_server: ServerProcess) -> None:
    result = drive({"url": agent_server.http, "scenario": "no_mic"})
    assert result["problems"] == []
    assert "refused" in result["NotAllowedError"]["notice"]
    assert "No microphone" in result["NotFoundError"]["notice"]
    assert result["NotAllowedError"]["talk"] == "Talk"


def test_plain_server_shows_the_plain_page(live_server: ServerProcess) -> None:
    result = drive({"url": live_server.http, "scenario": "plain"})
    assert result["problems"] == []
    assert not result["talkVisible"] and not result["captionVisible"] and result["micVisible"]

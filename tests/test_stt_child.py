"""The embedded recogniser in its own supervised process (lipstream.talk.hearing.stt_child / stt_embedded):
it hears
a spoken question as the in-process Whisper does, with word timings when asked; its endpoint answers only
the key holder and names bad audio; a killed child is replaced and the next decode works; one that cannot
load says why."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from lipstream.errors import ModelError
from lipstream.talk.hearing.stt import WhisperSTT, word_edits
from lipstream.talk.hearing.stt_embedded import EmbeddedWhisper
from lipstream.talk.hearing.stt_openai import wav_bytes
from lipstream.talk.models.model_process import RestartPolicy
from lipstream.talk.voices.tts import create_tts

pytestmark = pytest.mark.slow  # a model process

QUESTION = "What time does the library open on Saturday morning?"


@pytest.fixture(scope="module")
def question() -> np.ndarray:
    """The question in Piper's voice, 16 kHz float32."""
    return np.asarray(create_tts("piper").synthesize(QUESTION).pcm, np.float32)


@pytest.fixture(scope="module")
def whisper() -> Iterator[EmbeddedWhisper]:
    """One child for the module."""
    recogniser = EmbeddedWhisper()
    recogniser.warm_up()
    yield recogniser
    recogniser.close()


def test_the_child_hears_what_the_in_process_whisper_hears(whisper: EmbeddedWhisper, question) -> None:
    here = WhisperSTT(cpu_threads=1, workers=1).transcribe(question).text
    text = whisper.transcribe(question)
    assert text.text == here and word_edits(QUESTION, text.text)[0] <= 1, (text.text, here)
    assert text.words == ()  # a whole turn's text: no alignment pass asked for
    timed = whisper.transcribe_words(question)
    assert [w.strip(" ?.,").lower() for w, _, _ in timed.words][:3] == ["what", "time", "does"]
    starts = [start for _, start, _ in timed.words]
    assert starts == sorted(starts) and 0 <= starts[0] < starts[-1] < len(question) / 16000


def test_the_endpoint_wants_the_key_and_names_bad_audio(whisper: EmbeddedWhisper, question) -> None:
    endpoint = whisper.process.wait_ready(5)
    assert endpoint is not None
    url = f"{endpoint.url}/v1/audio/transcriptions"
    form = {"model": "whisper", "response_format": "json"}
    good = {"file": ("q.wav", wav_bytes(question), "audio/wav")}
    assert httpx.post(url, data=form, files=good, timeout=10).status_code == 401
    assert httpx.get(f"{endpoint.url}/health", timeout=5).status_code == 401
    auth = {"Authorization": f"Bearer {endpoint.key}"}
    junk = {"file": ("q.wav", b"RIFF....", "audio/wav")}
    bad = httpx.post(url, data=form, files=junk, headers=auth, timeout=10)
    assert bad.status_code == 400 and "not a WAV file" in bad.json()["error"]["message"]
    ok = httpx.post(url, data=form, files=good, headers=auth, timeout=10)
    assert ok.status_code == 200 and "library" in ok.json()["text"].lower()


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system) all of `pid`'s threads have used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_the_child_burns_no_cpu_beside_its_decodes(whisper: EmbeddedWhisper, question) -> None:
    """Its numpy has no spinning BLAS pool (one left ~100 ms of CPU per decode, taken from the frames)."""
    endpoint = whisper.process.wait_ready(5)
    assert endpoint is not None
    environ = Path(f"/proc/{endpoint.pid}/environ").read_bytes().split(b"\0")
    assert b"OPENBLAS_NUM_THREADS=1" in environ
    whisper.transcribe(question)
    cpu, wall = _cpu_seconds(endpoint.pid), 0.0
    for _ in range(8):
        started = time.perf_counter()
        whisper.transcribe(question)
        wall += time.perf_counter() - started
        time.sleep(0.2)  # a spinning pool would burn this gap
    used = _cpu_seconds(endpoint.pid) - cpu
    assert used < 1.5 * wall, (used, wall)  # measured: 1.0x without the pool's spin, 2.2x with it


def test_a_killed_child_is_replaced_and_the_next_decode_works(whisper: EmbeddedWhisper, question) -> None:
    first = whisper.process.wait_ready(5)
    assert first is not None
    os.kill(first.pid, signal.SIGKILL)
    started = time.monotonic()
    text = whisper.transcribe(question).text  # waits for the successor (or is asked again once it is up)
    assert "library" in text.lower() and time.monotonic() - started < 30
    status = whisper.process.status()
    assert status.restarts >= 1 and status.pid != first.pid


def test_a_child_that_cannot_load_says_why(tmp_path) -> None:
    (tmp_path / "model.bin").write_bytes(b"not a model")
    recogniser = EmbeddedWhisper(tmp_path, restart=RestartPolicy(max_failed_starts=1))
    try:
        with pytest.raises(ModelError, match="could not start: .*could not load Whisper"):
            recogniser.warm_up()
    finally:
        recogniser.close()


def test_the_beam_width_reaches_the_child(question) -> None:
    """`--stt-beam` goes to the child: it hears what an in-process Whisper of that beam hears."""
    here = WhisperSTT(cpu_threads=1, workers=1, beam_size=5).transcribe(question).text
    recogniser = EmbeddedWhisper(beam=5)
    try:
        recogniser.warm_up()
        argv = list(recogniser.process.command.argv)
        assert argv[argv.index("--beam") + 1] == "5"
        assert recogniser.transcribe(question).text == here
    finally:
        recogniser.close()

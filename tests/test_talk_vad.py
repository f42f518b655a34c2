"""Streaming VAD on silero's ONNX model: turns start and end at the right samples; clicks and noise don't."""

from __future__ import annotations

import time

import numpy as np
import pytest

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.talk.hearing.vad import WINDOW, SileroModel, VadEvent, VoiceActivityDetector

TOLERANCE = int(0.1 * SAMPLE_RATE)  # ±100 ms


@pytest.fixture(scope="module")
def model() -> SileroModel:
    return SileroModel()


@pytest.fixture(scope="module")
def utterances() -> list[np.ndarray]:
    from lipstream.talk.voices.tts import create_tts

    tts = create_tts("piper")
    texts = ["Hello there, what is the weather like today?", "Tell me a short story about the sea."]
    return [tts.synthesize(t).pcm for t in texts]


def _extent(pcm: np.ndarray) -> tuple[int, int]:
    """First and last sample of a 10 ms frame louder than -40 dBFS: where the voice really is."""
    hop = SAMPLE_RATE // 100
    frames = pcm[: len(pcm) // hop * hop].reshape(-1, hop)
    loud = np.nonzero(np.sqrt((frames**2).mean(axis=1)) > 0.01)[0]
    return int(loud[0] * hop), int((loud[-1] + 1) * hop)


def _feed(vad: VoiceActivityDetector, pcm: np.ndarray, chunk: int) -> list[VadEvent]:
    events: list[VadEvent] = []
    for i in range(0, len(pcm), chunk):
        events += vad.push(pcm[i : i + chunk])
    return events


def _silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SAMPLE_RATE), dtype=np.float32)


@pytest.mark.slow
@pytest.mark.parametrize("chunk", [320, 1000, 16000])
def test_turns_start_and_end_at_the_right_samples(model, utterances, chunk: int) -> None:
    pieces, truth = [_silence(1.0)], []
    for pcm in utterances:
        offset = sum(len(p) for p in pieces)
        start, end = _extent(pcm)
        truth.append((offset + start, offset + end))
        pieces += [pcm, _silence(1.2)]
    stream = np.concatenate(pieces)
    vad = VoiceActivityDetector(model=model)
    events = _feed(vad, stream, chunk)
    turns = [e for e in events if e.kind in ("speech_start", "speech_end")]
    assert [e.kind for e in turns] == ["speech_start", "speech_end"] * len(utterances)
    pairs = zip(turns[::2], turns[1::2], strict=True)
    for (start, end), (ev_start, ev_end) in zip(truth, pairs, strict=True):
        assert abs(ev_start.sample - start) <= TOLERANCE, (ev_start, start)
        assert abs(ev_end.sample - end) <= TOLERANCE, (ev_end, end)
    # Every confirmed end was announced by a pause at the same sample; resumes only ever follow pauses.
    pauses = [e for e in events if e.kind == "pause"]
    assert {e.sample for e in turns[1::2]} <= {p.sample for p in pauses}
    assert not vad.in_speech and vad.position == len(stream) // WINDOW * WINDOW


@pytest.mark.slow
def test_pause_comes_before_the_end_is_confirmed(model, utterances) -> None:
    vad = VoiceActivityDetector(model=model, pause_ms=128, end_silence_ms=500)
    stream = np.concatenate([_silence(0.5), utterances[1], _silence(1.0)])
    detected: dict[str, int] = {}
    for i in range(0, len(stream), WINDOW):
        for event in vad.push(stream[i : i + WINDOW]):
            detected.setdefault(event.kind, vad.position)
    # Detection times: pause ≈ 128 ms after the silence began, the end ≈ 500 ms after.
    lag = detected["speech_end"] - detected["pause"]
    assert 0.3 * SAMPLE_RATE <= lag <= 0.45 * SAMPLE_RATE


@pytest.mark.parametrize("kind", ["noise_burst", "click"])
def test_a_100_ms_burst_or_click_never_starts_a_turn(model, kind: str) -> None:
    rng = np.random.default_rng(0)
    burst = np.zeros(int(0.1 * SAMPLE_RATE), dtype=np.float32)
    if kind == "noise_burst":
        burst = (0.5 * rng.standard_normal(len(burst))).astype(np.float32)
    else:
        burst[:40] = np.hanning(40) * 0.9
    stream = np.concatenate([_silence(0.5), burst, _silence(1.0), burst, _silence(1.0)])
    vad = VoiceActivityDetector(model=model)
    assert _feed(vad, stream, 512) == []
    assert not vad.in_speech


@pytest.mark.slow
def test_a_short_cough_like_word_does_not_start_a_turn_but_a_real_one_does(model, utterances) -> None:
    """The first 100 ms of real speech alone is too short; the same voice for the whole sentence starts."""
    start, _ = _extent(utterances[0])
    short = utterances[0][start : start + int(0.1 * SAMPLE_RATE)]
    vad = VoiceActivityDetector(model=model)
    assert _feed(vad, np.concatenate([_silence(0.5), short, _silence(1.0)]), 512) == []
    assert [e.kind for e in _feed(vad, utterances[0], 512)][0] == "speech_start"


def test_silence_and_steady_noise_give_no_events(model) -> None:
    rng = np.random.default_rng(1)
    vad = VoiceActivityDetector(model=model)
    assert _feed(vad, _silence(3.0), 800) == []
    noise = (0.02 * rng.standard_normal(3 * SAMPLE_RATE)).astype(np.float32)  # fan / room noise
    assert _feed(vad, noise, 800) == []
    assert 0.0 <= vad.speech_probability < 0.5


@pytest.mark.slow
def test_reset_int16_input_and_window_cost(model, utterances) -> None:
    vad = VoiceActivityDetector(model=model)
    pcm16 = (np.concatenate([_silence(0.3), utterances[0], _silence(0.8)]) * 32767).astype(np.int16)
    first = _feed(vad, pcm16, 4096)
    vad.reset()
    assert vad.position == 0 and not vad.in_speech
    started = time.perf_counter()
    second = _feed(vad, pcm16.astype(np.float32) / 32768, 4096)
    per_window_ms = (time.perf_counter() - started) * 1000 / (len(pcm16) // WINDOW)
    assert [e.kind for e in first] == [e.kind for e in second]
    assert per_window_ms < 5  # measured ≈0.3–0.8 ms on 2 busy cores; a 32 ms window must stay cheap


def test_bad_parameters() -> None:
    with pytest.raises(ValueError):
        VoiceActivityDetector(threshold=1.5, model=object())  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        VoiceActivityDetector(pause_ms=600, end_silence_ms=500, model=object())  # type: ignore[arg-type]

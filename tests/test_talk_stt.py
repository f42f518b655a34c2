"""Speech-to-text: Whisper tiny.en (bundled) on Piper speech, the partial-transcript helper, WER."""

from __future__ import annotations

import numpy as np
import pytest

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.talk.stt import PartialTranscriber, SpeechToText, Transcript, WhisperSTT, word_error_rate

SENTENCES = [
    "What is the weather like in Paris tomorrow?",
    "Can you tell me a short story about a dragon?",
    "How many minutes are there in one day?",
    "Please remind me to call my sister tonight.",
    "Why is the sky blue during the day?",
]


@pytest.fixture(scope="module")
def stt() -> WhisperSTT:
    return WhisperSTT(cpu_threads=2)


@pytest.fixture(scope="module")
def spoken() -> list[np.ndarray]:
    from lipstream.talk.tts import create_tts

    tts = create_tts("piper")
    return [tts.synthesize(text).pcm for text in SENTENCES]


def test_word_error_rate() -> None:
    assert word_error_rate("Hello, world!", "hello world") == 0.0
    assert word_error_rate("a b c d", "a x c") == 0.5  # one substitution, one deletion
    assert word_error_rate("a b", "a b c d") == 1.0  # two insertions
    assert word_error_rate("", "") == 0.0


def test_whisper_transcribes_piper_speech_with_low_wer(stt: WhisperSTT, spoken: list[np.ndarray]) -> None:
    assert isinstance(stt, SpeechToText)
    errors = words = 0
    for text, pcm in zip(SENTENCES, spoken, strict=True):
        transcript = stt.transcribe(pcm)
        n = len(text.split())
        errors += round(word_error_rate(text, transcript.text) * n)
        words += n
        assert transcript.audio_seconds == pytest.approx(len(pcm) / SAMPLE_RATE)
        assert transcript.no_speech_prob < 0.5
    assert errors / words <= 0.10, f"WER {errors / words:.2%}"


def test_silence_and_tiny_input_give_no_words(stt: WhisperSTT) -> None:
    assert stt.transcribe(np.zeros(SAMPLE_RATE // 20, dtype=np.float32)).text == ""  # 50 ms: not decoded
    silent = stt.transcribe(np.zeros(SAMPLE_RATE, dtype=np.float32))
    assert silent.text == "" or silent.no_speech_prob > 0.5


class _CountingSTT:
    """A SpeechToText that records what it was asked to transcribe."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def transcribe(self, pcm: np.ndarray) -> Transcript:
        self.calls.append(len(pcm))
        return Transcript(f"{len(pcm)} samples", len(pcm) / SAMPLE_RATE)


def test_partial_transcriber_decodes_every_half_second() -> None:
    fake = _CountingSTT()
    partials = PartialTranscriber(fake, interval_s=0.5, min_seconds=0.3, max_seconds=2.0)
    chunk = np.zeros(SAMPLE_RATE // 10, dtype=np.float32)  # 100 ms
    decoded = []
    for _ in range(25):
        partials.push(chunk)
        if partials.due():
            decoded.append(partials.partial().text)
    assert fake.calls == [8000, 16000, 24000, 32000]  # every 0.5 s until max_seconds (2 s) is reached
    assert partials.full and partials.samples == 2 * SAMPLE_RATE
    assert partials.final().text == "32000 samples" and len(fake.calls) == 4  # nothing new: reused
    partials.reset()
    partials.push(chunk)
    assert not partials.due()  # under min_seconds
    assert partials.final().text == "1600 samples"


def test_partial_transcriber_with_whisper(stt: WhisperSTT, spoken: list[np.ndarray]) -> None:
    partials = PartialTranscriber(stt)
    pcm = spoken[0]
    texts = []
    for i in range(0, len(pcm), 1600):
        partials.push(pcm[i : i + 1600])
        if partials.due():
            texts.append(partials.partial().text)
    final = partials.final().text
    assert len(texts) >= 2 and texts[0] != final
    assert word_error_rate(SENTENCES[0], final) <= 0.15

"""Speech-to-text: Whisper tiny.en (bundled) on Piper speech, word timings, streaming recognition, WER."""

from __future__ import annotations

import numpy as np
import pytest

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.talk.hearing.stt import SpeechToText, WhisperSTT, word_error_rate
from lipstream.talk.hearing.transcriber import TurnRecogniser

pytestmark = pytest.mark.slow  # Whisper tiny.en and the Piper voice load

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
    from lipstream.talk.voices.tts import create_tts

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


def test_whisper_gives_word_timings_in_order(stt: WhisperSTT, spoken: list[np.ndarray]) -> None:
    pcm = spoken[1]
    result = stt.transcribe_words(pcm, prompt="Hello there.")
    assert result.words and word_error_rate(SENTENCES[1], result.text) <= 0.15
    starts = [start for _, start, _ in result.words]
    assert starts == sorted(starts)
    assert all(0 <= start <= end <= len(pcm) / SAMPLE_RATE + 0.1 for _, start, end in result.words)
    assert "".join(word for word, _, _ in result.words).strip() == result.text


def test_streaming_recognition_commits_words_and_decodes_only_the_tail(
    stt: WhisperSTT, spoken: list[np.ndarray]
) -> None:
    pcm = np.concatenate([spoken[0], np.zeros(SAMPLE_RATE // 5, np.float32), spoken[2]])
    recog = TurnRecogniser(stt, stt, turn_start=0, whole_turn_seconds=0.0)  # commits from the first words
    step = SAMPLE_RATE // 2
    for end in range(step, len(pcm), step):  # a partial decode every 0.5 s of speech, as a live turn has
        start = recog.audio_from()
        recog.partial(pcm[start:end], start)
    assert len(recog.state.committed) >= 4  # most of the first sentence is settled before the end
    tail_start = recog.audio_from()
    assert tail_start > len(pcm) // 3  # the final decode reads the last part only
    final = recog.final(pcm[tail_start:], tail_start)
    reference = f"{SENTENCES[0]} {SENTENCES[2]}"
    whole = stt.transcribe(pcm).text
    assert word_error_rate(reference, final) <= word_error_rate(reference, whole) + 0.1, (final, whole)

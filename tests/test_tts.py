"""Offline TTS: real Piper and espeak-ng voices, phoneme timings on the 16 kHz clock."""

from __future__ import annotations

import numpy as np
import pytest

from lipstream.audio.levels import frame_rms
from lipstream.engines.base import Speech
from lipstream.errors import SpeechError
from lipstream.talk.text import MAX_TEXT_CHARS, split_sentences
from lipstream.talk.voices.phonemes import PAUSE, RawPhone, merge_phones, to_timings
from lipstream.talk.voices.tts import TTS, EspeakTTS, PiperTTS, create_tts

TEXT = "Bob met Pam at the bridge. Good evening!"


@pytest.fixture(scope="module")
def piper() -> PiperTTS:
    return PiperTTS()


@pytest.fixture(scope="module")
def espeak() -> EspeakTTS:
    return EspeakTTS()


def _check_timings(speech: Speech) -> None:
    timings = speech.phonemes
    assert timings, "phoneme timings expected"
    assert timings[0].start == 0 and timings[-1].end == len(speech.pcm)
    for prev, cur in zip(timings, timings[1:], strict=False):
        assert prev.end == cur.start and cur.end > cur.start
    assert all(t.phoneme not in ("ˈ", "ˌ", "ː", " ", "^", "$") for t in timings)


def _rms(pcm: np.ndarray) -> float:
    return float(np.sqrt(np.mean(pcm.astype(np.float64) ** 2))) if pcm.size else 0.0


@pytest.mark.slow
@pytest.mark.parametrize("voice", ["piper", "espeak"])
def test_synthesize_speech_with_timings(voice: str, piper: PiperTTS, espeak: EspeakTTS) -> None:
    tts = piper if voice == "piper" else espeak
    speech = tts.synthesize(TEXT)
    assert isinstance(speech, Speech) and speech.sample_rate == 16000 and speech.pcm.dtype == np.float32
    assert 1.5 < speech.seconds < 5.0
    assert np.abs(speech.pcm).max() <= 1.0 and frame_rms(speech.pcm).max() > -25
    _check_timings(speech)
    symbols = [t.phoneme for t in speech.phonemes]
    for bilabial in ("b", "m", "p"):
        assert bilabial in symbols
    # Timings must match the audio: the sentence pause is much quieter than the vowels.
    pauses = [t for t in speech.phonemes if t.phoneme == PAUSE and t.end - t.start > 1600]
    vowels = [t for t in speech.phonemes if t.phoneme in ("ɑ", "æ", "ɛ", "ɪ", "iː", "ʊ")]
    assert pauses and vowels
    pause_level = np.median([_rms(speech.pcm[t.start + 400 : t.end - 400]) for t in pauses])
    vowel_level = np.median([_rms(speech.pcm[t.start : t.end]) for t in vowels])
    assert pause_level < 0.2 * vowel_level


@pytest.mark.slow
def test_piper_is_deterministic(piper: PiperTTS) -> None:
    a, b = piper.synthesize("Good evening."), piper.synthesize("Good evening.")
    assert np.array_equal(a.pcm, b.pcm)
    assert a.phonemes == b.phonemes


@pytest.mark.slow
@pytest.mark.parametrize("voice", ["piper", "espeak"])
def test_sentences_stream_one_by_one(voice: str, piper: PiperTTS, espeak: EspeakTTS) -> None:
    tts = piper if voice == "piper" else espeak
    parts = list(tts.synthesize_sentences("Good evening.  Tonight the bridge reopened! Is it safe?"))
    if voice == "espeak":
        assert [p.text for p in parts] == ["Good evening.", "Tonight the bridge reopened!", "Is it safe?"]
    else:  # each sentence in pieces, each piece with its share of the words
        assert len(parts) > 3
        assert (
            " ".join(p.text for p in parts if p.text)
            == "Good evening. Tonight the bridge reopened! Is it safe?"
        )
    for part in parts:
        _check_timings(part)
    whole = tts.synthesize("Good evening.  Tonight the bridge reopened! Is it safe?")
    assert abs(sum(p.seconds for p in parts) - whole.seconds) < 0.5


@pytest.mark.slow
@pytest.mark.parametrize("text", ["", "   \n", "...!?", " -- ; "])
@pytest.mark.parametrize("voice", ["piper", "espeak"])
def test_nothing_speakable(text: str, voice: str, piper: PiperTTS, espeak: EspeakTTS) -> None:
    tts = piper if voice == "piper" else espeak
    with pytest.raises(SpeechError, match="nothing to speak"):
        tts.synthesize(text)
    with pytest.raises(SpeechError, match="nothing to speak"):
        list(tts.synthesize_sentences(text))


def test_text_length_limit(espeak: EspeakTTS) -> None:
    with pytest.raises(SpeechError, match=f"limit of {MAX_TEXT_CHARS}"):
        espeak.synthesize("word " * (MAX_TEXT_CHARS // 5 + 10))


def test_espeak_voice_selection() -> None:
    british = EspeakTTS("en-gb").synthesize("Tomato.")
    american = EspeakTTS("en-us").synthesize("Tomato.")
    assert british.source == "espeak:en-gb"
    assert [t.phoneme for t in british.phonemes] != [t.phoneme for t in american.phonemes]
    with pytest.raises(SpeechError, match="unknown espeak-ng voice"):
        EspeakTTS("xx-nope")


def test_create_tts() -> None:
    assert isinstance(create_tts("espeak"), EspeakTTS)
    assert isinstance(create_tts("espeak"), TTS)
    with pytest.raises(SpeechError, match="unknown voice"):
        create_tts("festival")


def test_merge_phones_rules() -> None:
    raw = [
        RawPhone(s, n)
        for s, n in [
            ("^", 10),
            ("ˈ", 5),
            ("i", 20),
            ("ː", 10),
            (" ", 4),
            ("b", 6),
            (",", 30),
            (" ", 3),
            ("ʃ", 8),
            ("$", 7),
        ]
    ]
    assert merge_phones(raw) == [(PAUSE, 10), ("iː", 39), ("b", 6), (PAUSE, 33), ("ʃ", 8), (PAUSE, 7)]
    timings = to_timings(merge_phones(raw), 22050, round(99 * 16000 / 22050))
    assert timings[0].start == 0 and timings[-1].end == 72


def test_split_sentences() -> None:
    assert split_sentences("One. Two!  Three? ...") == ["One.", "Two!", "Three?"]


def test_run_on_text_is_spoken_in_bounded_pieces() -> None:
    pieces = split_sentences(("word " * 900).strip())
    assert all(len(p) <= 200 for p in pieces) and " ".join(pieces) == ("word " * 900).strip()
    commas = split_sentences("Hello there, " * 40, quick_start=False)
    assert all(len(p) <= 200 and p.endswith(",") for p in commas[:-1])

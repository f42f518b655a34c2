"""Issue 48: every text path starts from a short first phrase, and the cut does not show in the audio."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import numpy as np
import pytest

from lipstream.audio.speech import PhonemeTiming, Speech
from lipstream.talk.voices import phrase_seam
from lipstream.talk.voices.sentences import FIRST_MAX_WORDS, SentenceStream, split_first_phrase
from lipstream.talk.voices.speaker import Speaker
from lipstream.talk.voices.tts import EspeakTTS, PiperTTS

LONG = (
    "The museum on the hill will open late on Fridays this summer with live music in the garden and free "
    "entry for children under twelve. That is all for tonight."
)
NO_PLACE = "The weather is calm and dry tonight along the coast where strong winds blew all week."


def _words(texts: list[str]) -> list[str]:
    return " ".join(texts).replace(",", " ").split()


def test_split_first_phrase_cuts_a_long_first_sentence_short() -> None:
    head, rest = split_first_phrase(LONG)
    assert len(head.split()) <= FIRST_MAX_WORDS + 2
    assert _words([head, rest]) == _words([LONG])
    assert rest.endswith("That is all for tonight.")  # later sentences are left whole


def test_split_first_phrase_is_the_conversations_rule() -> None:
    """One rule: the speak path's head is the piece the conversation's splitter gives for the same text as
    it streams in word by word."""
    for text in (LONG, NO_PLACE, "Good evening, and welcome to the late news on a windy night.",
                 "The moon is about 238,900 miles away from the Earth on average."):  # fmt: skip
        stream = SentenceStream()
        pieces: list[str] = []
        for word in text.split(" "):
            pieces += stream.push(word + " ")
        pieces += stream.flush()
        assert split_first_phrase(text)[0] == pieces[0]


@pytest.mark.parametrize("text", ["Good evening.", "Welcome to the evening news. Good night.", "Hello"])
def test_split_first_phrase_leaves_short_first_sentences_whole(text: str) -> None:
    assert split_first_phrase(text) == [text]


class _WordVoice:
    """A voice that speaks 0.2 s per word, with 0.1 s of silence around each text, and records its texts."""

    name = "words"

    def __init__(self) -> None:
        self.said: list[str] = []

    def synthesize(self, text: str) -> Speech:
        return next(self.synthesize_sentences(text))

    def synthesize_sentences(self, text: str) -> Iterator[Speech]:
        self.said.append(text)
        quiet = np.zeros(1600, np.float32)
        voiced = 0.3 * np.sin(np.arange(3200 * len(text.split())) / 5.0).astype(np.float32)
        pcm = np.concatenate([quiet, voiced, quiet])
        yield Speech(pcm=pcm, phonemes=[PhonemeTiming("a", 0, len(pcm))], text=text)


async def _speak(speaker: Speaker, text: str, quick_start: bool) -> list[Speech]:
    return [speech async for speech in await speaker.speak(text, quick_start=quick_start)]


def test_speaker_speaks_the_first_phrase_first_and_every_word() -> None:
    voice = _WordVoice()
    speeches = asyncio.run(_speak(Speaker(voices=lambda _name: voice), LONG, quick_start=True))
    head = split_first_phrase(LONG)[0]
    assert voice.said[0] == f"{head},"  # read with a continuing pitch
    assert speeches[0].text == head  # captions show the text as written
    assert _words([s.text or "" for s in speeches]) == _words([LONG])
    # the silence at the cut is trimmed to a word gap; the utterance's own start and end keep theirs
    gap = phrase_seam.KEEP_BEFORE_CUT_MS + phrase_seam.KEEP_AFTER_CUT_MS
    assert abs(_trailing_silence_ms(speeches[0]) + _leading_silence_ms(speeches[1]) - gap) <= 5
    assert _leading_silence_ms(speeches[0]) == 100 and _trailing_silence_ms(speeches[-1]) == 100
    for speech in speeches:
        assert speech.phonemes[0].start == 0 and speech.phonemes[-1].end == len(speech.pcm)


def test_speaker_without_quick_start_is_unchanged() -> None:
    """The conversation cuts its own first phrase (SentenceStream): its sentences are spoken as given."""
    voice = _WordVoice()
    speeches = asyncio.run(_speak(Speaker(voices=lambda _name: voice), LONG, quick_start=False))
    assert voice.said == [LONG] and [s.text for s in speeches] == [LONG]


def _silent_ms(pcm: np.ndarray) -> np.ndarray:
    """Per 5 ms window: True where quieter than the seam's silence level."""
    count = len(pcm) // 80
    rms = np.sqrt((pcm[: count * 80].reshape(count, 80).astype(np.float64) ** 2).mean(axis=1))
    return rms <= phrase_seam.SILENCE_RMS


def _leading_silence_ms(speech: Speech) -> int:
    return int(np.argmin(_silent_ms(speech.pcm))) * 5


def _trailing_silence_ms(speech: Speech) -> int:
    return int(np.argmin(_silent_ms(speech.pcm)[::-1])) * 5


def _longest_inner_gap_ms(pcm: np.ndarray) -> int:
    """The longest run of silence between the first and the last voiced window."""
    silent = _silent_ms(pcm)
    voiced = np.flatnonzero(~silent)
    longest = run = 0
    for quiet in silent[voiced[0] : voiced[-1] + 1]:
        run = run + 1 if quiet else 0
        longest = max(longest, run)
    return longest * 5


@pytest.fixture(scope="module", params=["piper", "espeak"])
def voice(request: pytest.FixtureRequest):  # noqa: ANN201 - a TTS
    # Piper whole, as a voice whose model cannot be cut in stages (test_piper_pieces covers the pieces)
    return PiperTTS(threads=1, in_pieces=False) if request.param == "piper" else EspeakTTS()


def test_the_cut_is_seamless_with_a_real_voice(voice) -> None:  # noqa: ANN001
    """No gap of silence at the cut longer than the voice's own gaps between words in the uncut sentence,
    and no click: the waveform's step at the join and the loudness around it stay at the silence's level."""
    sentence = LONG.split(". ")[0] + "."
    speeches = asyncio.run(_speak(Speaker(voices=lambda _name: voice), sentence, quick_start=True))
    assert len(speeches) == 2
    joined = np.concatenate([s.pcm for s in speeches])
    cut = len(speeches[0].pcm)
    whole = voice.synthesize(sentence)
    seam_gap = _trailing_silence_ms(speeches[0]) + _leading_silence_ms(speeches[1])
    # the uncut sentence's longest pause between words, at least one window pair: 2 x 5 ms rounding
    assert seam_gap <= max(_longest_inner_gap_ms(whole.pcm), 60) + 10, seam_gap
    assert abs(float(joined[cut]) - float(joined[cut - 1])) < 0.01  # a click is a step of 0.1 or more
    # a click is a burst of high frequencies: the waveform's first difference over the 10 ms around the cut
    # stays under its median over the utterance's 10 ms windows
    steps = np.diff(joined.astype(np.float64))
    count = len(steps) // 160
    typical = np.median(np.sqrt((steps[: count * 160].reshape(count, 160) ** 2).mean(axis=1)))
    assert np.sqrt((steps[cut - 80 : cut + 80] ** 2).mean()) < typical
    assert abs(len(joined) - len(whole.pcm)) < 0.25 * len(whole.pcm)  # no word lost, none doubled

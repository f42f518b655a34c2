"""Turn a TTS voice's raw phoneme durations into contiguous IPA timings on the 16 kHz clock."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from lipstream.audio.speech import PhonemeTiming
from lipstream.audio.timeline import SAMPLE_RATE

PAUSE = "_"  # symbol of a silent stretch (punctuation pause, sentence start/end)
STRESS_MARKS = frozenset("ˈˌ")


@dataclass(frozen=True)
class RawPhone:
    """One symbol as the voice reports it, with its duration in samples at the voice's own rate."""

    symbol: str
    samples: int


def _kind(symbol: str) -> str:
    """Classify a raw symbol: 'pause', 'space', 'stress', 'modifier' (ː, ʲ, ...) or 'phone'."""
    if symbol in ("", "^", "$", PAUSE) or all(unicodedata.category(c).startswith("P") for c in symbol):
        return "pause"
    if symbol.isspace():
        return "space"
    if symbol in STRESS_MARKS:
        return "stress"
    if all(unicodedata.category(c) == "Lm" for c in symbol):
        return "modifier"
    return "phone"


def merge_phones(raw: Sequence[RawPhone]) -> list[tuple[str, int]]:
    """Merge modifiers into real phonemes so every entry is one speakable IPA unit or a pause.

    Stress marks give their time to the next phoneme (it is the onset of the stressed vowel); length
    marks and other modifier letters join the phoneme before them ("i" + "ː" -> "iː"); a word space joins
    the phoneme before it (there is no silence between words in connected speech); punctuation and the
    start/end markers become pauses, and adjacent pauses merge.
    """
    merged: list[list] = []  # [symbol, samples]
    carry = 0  # samples owed to the next phoneme (from stress marks)
    for phone in raw:
        kind = _kind(phone.symbol)
        if kind == "stress":
            carry += phone.samples
        elif kind in ("modifier", "space") and merged and merged[-1][0] != PAUSE:
            merged[-1][1] += phone.samples
            if kind == "modifier":
                merged[-1][0] += phone.symbol
        elif kind == "phone":
            merged.append([phone.symbol, phone.samples + carry])
            carry = 0
        elif merged and merged[-1][0] == PAUSE:
            merged[-1][1] += phone.samples  # pause after pause, or a stray space/modifier after a pause
        else:
            merged.append([PAUSE, phone.samples])
    if carry:
        if merged:
            merged[-1][1] += carry
        else:
            merged.append([PAUSE, carry])
    return [(symbol, samples) for symbol, samples in merged if samples > 0]


def to_timings(
    merged: Sequence[tuple[str, int]], rate_in: int, total_samples_16k: int
) -> list[PhonemeTiming]:
    """Place merged phones back to back from sample 0, rescaled to 16 kHz; the last ends at the audio end."""
    timings: list[PhonemeTiming] = []
    position = 0
    for symbol, samples in merged:
        start = min(round(position * SAMPLE_RATE / rate_in), total_samples_16k)
        position += samples
        end = min(round(position * SAMPLE_RATE / rate_in), total_samples_16k)
        if end > start:
            timings.append(PhonemeTiming(symbol, start, end))
    if timings and timings[-1].end < total_samples_16k:
        last = timings[-1]
        timings[-1] = PhonemeTiming(last.phoneme, last.start, total_samples_16k)
    return timings


def timings_between(timings: Sequence[PhonemeTiming], start: int, end: int) -> list[PhonemeTiming]:
    """The timings of samples [start, end) of a speech, clipped to that span and counted from its start."""
    return [
        PhonemeTiming(t.phoneme, max(start, t.start) - start, min(end, t.end) - start)
        for t in timings
        if min(end, t.end) > max(start, t.start)
    ]


# what a voice writes between words: a space, and a punctuation mark before it
GAP_SYMBOLS = frozenset(" ,.;:!?\u2014\u2013-")


def word_gaps(phonemes: Sequence[str]) -> list[tuple[int, int]]:
    """The [start, end) of each run of symbols between words (spaces and punctuation) in a voice's phoneme
    list, in order; runs at the very start are left out."""
    gaps, start = [], None
    for index, symbol in enumerate(phonemes):
        if symbol in GAP_SYMBOLS:
            start = index if start is None else start
        else:
            if start is not None and start > 0:
                gaps.append((start, index))
            start = None
    return gaps

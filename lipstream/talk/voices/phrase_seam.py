"""The join where a text's first phrase was cut off, so that its audio starts sooner (issue 48).

The first phrase and the rest are synthesised apart, so each comes back with the silence a voice puts around a
whole utterance, and the phrase ends on a falling, final pitch. Here the phrase is read with a comma after it
(the voice ends it on a continuing pitch, as mid-sentence), and the silence on both sides of the cut is
trimmed to a word gap, with a few milliseconds of fade where a cut lands, so the two play as one sentence.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from lipstream.audio.speech import Speech
from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.talk.voices.phonemes import timings_between

# silence kept on each side of the cut: together about the pause between two words of one phrase in Piper's
# and espeak-ng's own sentences (measured: 20-60 ms), under the 100+ ms a comma's pause takes
KEEP_BEFORE_CUT_MS = 35
KEEP_AFTER_CUT_MS = 15
FADE_MS = 4  # the trimmed edge reaches zero over this long: no step in the waveform, no click
_WINDOW = SAMPLE_RATE // 200  # 5 ms: the loudness of speech is judged per window
SILENCE_RMS = 0.006  # about -44 dBFS; the voices' pauses are far quieter, their softest consonants louder
_CONTINUING = ",;:\u2013\u2014"


def phrase_for_voice(head: str) -> str:
    """The first phrase as the voice reads it: with a comma when it has no clause mark, so the voice ends it
    on a continuing pitch instead of a sentence's final fall."""
    return head if head.rstrip()[-1:] in _CONTINUING else f"{head.rstrip()},"


def end_at_cut(speech: Speech, text: str) -> Speech:
    """The first phrase's speech with its trailing silence cut to KEEP_BEFORE_CUT_MS, labelled `text` (the
    phrase as written, not as the voice read it)."""
    last = _voiced_edge(speech.pcm, from_end=True)
    end = min(len(speech.pcm), last + _ms(KEEP_BEFORE_CUT_MS))
    return dataclasses.replace(_cut(speech, 0, end), text=text)


def start_at_cut(speech: Speech) -> Speech:
    """The rest's first speech with its leading silence cut to KEEP_AFTER_CUT_MS."""
    first = _voiced_edge(speech.pcm, from_end=False)
    return _cut(speech, max(0, first - _ms(KEEP_AFTER_CUT_MS)), len(speech.pcm))


def _ms(ms: float) -> int:
    return int(round(ms * SAMPLE_RATE / 1000))


def _voiced_edge(pcm: np.ndarray, from_end: bool) -> int:
    """The first (or last) sample of the first (or last) 5 ms window louder than SILENCE_RMS; the far end
    when no window is."""
    count = len(pcm) // _WINDOW
    if count == 0:
        return len(pcm) if from_end else 0
    windows = pcm[: count * _WINDOW].reshape(count, _WINDOW).astype(np.float64)
    loud = np.flatnonzero(np.sqrt((windows**2).mean(axis=1)) > SILENCE_RMS)
    if loud.size == 0:
        return len(pcm) if from_end else 0
    return int(loud[-1] + 1) * _WINDOW if from_end else int(loud[0]) * _WINDOW


def _cut(speech: Speech, start: int, end: int) -> Speech:
    """Samples [start, end) of the speech, faded in (when cut at the start) and out (at the end), with its
    phoneme timings moved and clipped to match."""
    pcm = speech.pcm[start:end].copy()
    fade = min(_ms(FADE_MS), len(pcm) // 2)
    if fade > 0:
        ramp = np.linspace(0.0, 1.0, fade, endpoint=False, dtype=np.float32)
        if start > 0:
            pcm[:fade] *= ramp
        if end < len(speech.pcm):
            pcm[-fade:] *= ramp[::-1]
    phonemes = None if speech.phonemes is None else timings_between(speech.phonemes, start, end)
    return dataclasses.replace(speech, pcm=pcm, phonemes=phonemes)

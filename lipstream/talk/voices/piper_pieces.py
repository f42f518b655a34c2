"""One sentence of a staged Piper voice as a stream of 16 kHz pieces, the first one short (issue 48).

The pieces are consecutive runs of the same sentence's audio (`StagedVoice.audio`), resampled as one stream,
so they join sample for sample: nothing is cut from the text and no seam needs hiding. Piper scales each
sentence to full range by its peak, which is only known once the whole sentence is made; here the scale comes
from the first piece (the sentence's peak lies in its first 0.7 s in 12 of 16 sentences measured, and is at
most ~10 % higher elsewhere), and a soft limiter keeps a later, louder peak under full range.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lipstream.audio.decode import StreamResampler
from lipstream.audio.speech import PhonemeTiming, Speech
from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.talk.voices.phonemes import RawPhone, merge_phones, timings_between, to_timings
from lipstream.talk.voices.piper_stages import Prior, StagedVoice, piece_bounds

MIN_PEAK = 0.25  # a first piece quieter than this (a soft onset) is not scaled up more than 4x
LIMIT_KNEE = 0.9  # above this the limiter bends the waveform smoothly towards full range


@dataclass(frozen=True)
class StagedSentence:
    """One Piper sentence after the text side: its prior and its phones (None when they do not align)."""

    prior: Prior
    phones: list[RawPhone] | None


def peak_normalized(audio: np.ndarray) -> np.ndarray:
    """Scaled so that its peak is full range, as piper does to each sentence (silence stays silent)."""
    peak = float(np.abs(audio).max()) if audio.size else 0.0
    scaled = audio / peak if peak >= 1e-8 else np.zeros_like(audio)
    return np.clip(scaled, -1.0, 1.0).astype(np.float32)


def soft_limit(audio: np.ndarray) -> np.ndarray:
    """Samples above LIMIT_KNEE bent towards full range (tanh), the rest untouched: never past +-1."""
    out = audio.astype(np.float32, copy=True)
    over = np.abs(out) > LIMIT_KNEE
    if over.any():
        room = 1.0 - LIMIT_KNEE
        out[over] = np.sign(out[over]) * (
            LIMIT_KNEE + room * np.tanh((np.abs(out[over]) - LIMIT_KNEE) / room)
        )
    return out


def phone_samples(
    config: Any, phonemes: Sequence[str], ids: Sequence[int], prior: Prior
) -> list[RawPhone] | None:
    """Each phoneme's samples at the voice's rate (its ids and the pad after it, as piper counts them), from
    the text side's durations; None when the ids do not follow the phonemes (a phoneme the voice lacks)."""
    from piper.const import BOS, EOS, PAD

    pad = list(config.phoneme_id_map.get(PAD, []))
    samples = prior.frames_per_id * int(config.hop_length)
    if len(samples) != len(ids):
        return None
    phones, index = [], 0
    for phoneme in [BOS, *phonemes, EOS]:
        expected = list(config.phoneme_id_map.get(phoneme, [])) + (pad if phoneme != EOS else [])
        if list(ids[index : index + len(expected)]) != expected:
            return None
        phones.append(RawPhone(phoneme, int(samples[index : index + len(expected)].sum())))
        index += len(expected)
    return phones


def sentence_pieces(
    voice: StagedVoice, parts: Sequence[StagedSentence], text: str, rate: int
) -> Iterator[Speech]:
    """The sentence `text` (Piper's `parts` of it) as consecutive Speech pieces, each made when pulled: the
    first FIRST_PIECE_FRAMES long, then longer; the first carries the sentence's text and length."""
    total = sum(part.prior.frames for part in parts) * voice.hop
    expected = math.ceil(total * SAMPLE_RATE / rate)  # what the resampler gives for `total` samples
    timings: list[PhonemeTiming] | None = None
    if all(part.phones is not None for part in parts):
        raw = [phone for part in parts for phone in part.phones or []]
        if sum(phone.samples for phone in raw) == total:
            timings = to_timings(merge_phones(raw), rate, expected)
    spans = [(part.prior, span) for part in parts for span in piece_bounds(part.prior.frames)]
    resampler = StreamResampler(rate)
    gain, start = None, 0
    for index, (prior, (first, last)) in enumerate(spans):
        audio = voice.audio(prior, first, last)
        if gain is None:
            gain = 1.0 / max(MIN_PEAK, float(np.abs(audio).max()) if audio.size else 0.0)
        pcm = resampler.push(soft_limit(audio * gain))
        if index == len(spans) - 1:
            pcm = np.concatenate([pcm, resampler.flush()])
        end = start + len(pcm)
        yield Speech(
            pcm=pcm,
            phonemes=None if timings is None else timings_between(timings, start, end),
            text=text if index == 0 else None,  # one `text` event a sentence, at its first frame
            text_samples=expected if index == 0 else None,
            source="piper",
        )
        start = end

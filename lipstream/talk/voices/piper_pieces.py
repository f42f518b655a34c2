"""One sentence of a staged Piper voice as a stream of 16 kHz pieces, the first one short (issue 48).

The pieces are consecutive runs of the same sentence's audio (`StagedVoice.audio`), resampled as one stream,
so they join sample for sample: nothing is cut from the text and no seam needs hiding. Piper scales each
sentence to full range by its peak, which is only known once the whole sentence is made; here the scale comes
from the first piece (the sentence's peak lies in its first 0.7 s in 12 of 16 sentences measured, and is at
most ~10 % higher elsewhere), and a soft limiter keeps a later, louder peak under full range.

A long first sentence (`head_pieces`) starts from the text side of its first words alone, so that its first
audio does not wait for the text side of the whole sentence, which grows with it; the rest is made from the
whole sentence's text side and joined in the middle of a gap between two words, cross-faded.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
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
# the head and the rest of a long sentence cross-fade over this many frames (~23 ms) at the cut
SEAM_FRAMES = 2
# ... and the whole sentence's text side runs once this many of the head's frames are out (~0.74 s to play
# while it runs): run after the first piece (~0.19 s), the piece after it came late, and the page's audio
# ran dry after 5 of 18 first pieces (first_frame, whole frames, this Xeon)
WHOLE_AFTER_FRAMES = 64


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


class _PieceStream:
    """Raw pieces of one sentence made into consecutive 16 kHz Speech: one gain (from the first piece), one
    resampler (so pieces join sample for sample), timings cut to each piece."""

    def __init__(self, text: str, rate: int, text_samples: int, timings: list[PhonemeTiming] | None) -> None:
        self.text, self.text_samples, self.timings = text, text_samples, timings
        self.resampler = StreamResampler(rate)
        self.gain: float | None = None
        self.start = 0  # 16 kHz samples handed out so far

    def speech(self, audio: np.ndarray, last: bool) -> Speech:
        """The next piece from its raw samples (`last`: the sentence's end, the filter flushed)."""
        if self.gain is None:
            self.gain = 1.0 / max(MIN_PEAK, float(np.abs(audio).max()) if audio.size else 0.0)
        pcm = self.resampler.push(soft_limit(audio * self.gain))
        if last:
            pcm = np.concatenate([pcm, self.resampler.flush()])
        first, end = self.start == 0, self.start + len(pcm)
        piece = Speech(
            pcm=pcm,
            phonemes=None if self.timings is None else timings_between(self.timings, self.start, end),
            text=self.text if first else None,  # one `text` event a sentence, at its first frame
            text_samples=self.text_samples if first else None,
            source="piper",
        )
        self.start = end
        return piece


def _to_16k(samples: int, rate: int) -> int:
    """What the resampler gives for `samples` at `rate`."""
    return math.ceil(samples * SAMPLE_RATE / rate)


def sentence_pieces(
    voice: StagedVoice, parts: Sequence[StagedSentence], text: str, rate: int
) -> Iterator[Speech]:
    """The sentence `text` (Piper's `parts` of it) as consecutive Speech pieces, each made when pulled: the
    first FIRST_PIECE_FRAMES long, then longer; the first carries the sentence's text and length."""
    total = sum(part.prior.frames for part in parts) * voice.hop
    expected = _to_16k(total, rate)
    timings: list[PhonemeTiming] | None = None
    if all(part.phones is not None for part in parts):
        raw = [phone for part in parts for phone in part.phones or []]
        if sum(phone.samples for phone in raw) == total:
            timings = to_timings(merge_phones(raw), rate, expected)
    stream = _PieceStream(text, rate, expected, timings)
    spans = [(part.prior, span) for part in parts for span in piece_bounds(part.prior.frames)]
    for index, (prior, (first, last)) in enumerate(spans):
        yield stream.speech(voice.audio(prior, first, last), last=index == len(spans) - 1)


@dataclass(frozen=True)
class Head:
    """A long sentence's first words through the text side alone (with a few words after them, so that
    their prosody runs on), to be cut in the middle of the gap between two words: `ids` and `phones` of
    `sentence` come before the gap, which spans `gap_ids` ids and `gap_phones` phones."""

    sentence: StagedSentence
    ids: int
    phones: int
    gap_ids: int
    gap_phones: int
    whole_ids: int  # the whole sentence's phoneme ids, for its length before its text side has run

    def cut(self, prior: Prior) -> tuple[int, int]:
        """Frames before the gap in `prior` (the head's or the whole sentence's), and the cut's frame: half
        way through the gap, where the two join in the pause between the words (if any)."""
        before = int(prior.frames_per_id[: self.ids].sum())
        gap = int(prior.frames_per_id[self.ids : self.ids + self.gap_ids].sum())
        return before, before + gap // 2


def head_pieces(
    voice: StagedVoice, head: Head, whole: Callable[[], list[StagedSentence]], text: str, rate: int
) -> Iterator[Speech]:
    """The sentence `text` as consecutive pieces whose first ones come from `head`'s text side only; the
    whole sentence's text side (`whole()`) runs once WHOLE_AFTER_FRAMES are out, while they play, and the rest
    is made from it, cross-faded into the head over SEAM_FRAMES at the cut (their latents differ a little:
    the head's text side did not read the whole sentence)."""
    prior, hop = head.sentence.prior, voice.hop
    before, cut = head.cut(prior)
    # the caption's length before the whole is known: the head's frames per phoneme id, over all its ids
    estimate = _to_16k(round(prior.frames / len(prior.frames_per_id) * head.whole_ids) * hop, rate)
    said = None  # the head's phones, its part of the gap last
    if head.sentence.phones is not None:
        gap = head.sentence.phones[head.phones].symbol
        said = [*head.sentence.phones[: head.phones], RawPhone(gap, (cut - before) * hop)]
    timings = None if said is None else to_timings(merge_phones(said), rate, _to_16k(cut * hop, rate))
    stream = _PieceStream(text, rate, estimate, timings)
    spans = piece_bounds(cut)
    overlap = np.zeros(0, np.float32)
    parts: list[StagedSentence] | None = None
    for index, (first, last) in enumerate(spans):
        if parts is None and first >= WHOLE_AFTER_FRAMES:
            parts = whole()  # the head's pieces out so far play while it runs
        final = index == len(spans) - 1
        audio = voice.audio(prior, first, last + (SEAM_FRAMES if final else 0))
        if final:  # the frames after the cut are kept to fade out under the rest
            audio, overlap = audio[: (last - first) * hop], audio[(last - first) * hop :]
        yield stream.speech(audio, last=False)
    if parts is None:
        parts = whole()
    rest_before, rest_cut = head.cut(parts[0].prior)
    if said is not None:  # the timings again, over the head's phones and the rest's: merged across the cut
        rest = _rest_phones(parts, head, rest_cut - rest_before, rest_cut, hop)
        total = _to_16k((cut + sum(part.prior.frames for part in parts) - rest_cut) * hop, rate)
        stream.timings = None if rest is None else to_timings(merge_phones(said + rest), rate, total)
    # the rest's pieces as the whole sentence's would fall after the cut: long ones, the head plays meanwhile
    spans = [(parts[0].prior, max(a, rest_cut), b)
             for a, b in piece_bounds(parts[0].prior.frames) if b > rest_cut]  # fmt: skip
    spans += [(part.prior, a, b) for part in parts[1:] for a, b in piece_bounds(part.prior.frames)]
    for index, (part_prior, first, last) in enumerate(spans):
        audio = voice.audio(part_prior, first, last)
        if index == 0:
            audio = _cross_faded(overlap, audio)
        yield stream.speech(audio, last=index == len(spans) - 1)


def _cross_faded(fading: np.ndarray, audio: np.ndarray) -> np.ndarray:
    """`audio` with `fading` (the head's samples past the cut) faded out under its start."""
    n = min(len(fading), len(audio))
    if n == 0:
        return audio
    rise = (np.arange(n, dtype=np.float32) + 0.5) / n
    out = audio.astype(np.float32, copy=True)
    out[:n] = fading[:n] * (1.0 - rise) + out[:n] * rise
    return out


def _rest_phones(
    parts: Sequence[StagedSentence], head: Head, gap_said: int, cut: int, hop: int
) -> list[RawPhone] | None:
    """The sentence's phones after the cut, `cut` frames into its first part (`gap_said` of them in the gap,
    said by the head); None when some phones are unknown or do not add up to the frames."""
    if any(part.phones is None for part in parts):
        return None
    first = parts[0].phones or []
    gap = first[head.phones : head.phones + head.gap_phones]
    later = [phone for part in parts[1:] for phone in part.phones or []]
    raw = [RawPhone(gap[0].symbol, sum(phone.samples for phone in gap) - gap_said * hop),
           *first[head.phones + head.gap_phones :], *later]  # fmt: skip
    frames = sum(part.prior.frames for part in parts) - cut
    return raw if sum(phone.samples for phone in raw) == frames * hop else None

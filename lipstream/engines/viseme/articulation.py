"""Phonemes -> mouth articulation targets, and known phoneme timings -> per-frame articulation."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import erf  # at import, not in the first utterance (importing it takes ~0.25 s)

from lipstream.audio.timeline import SAMPLE_RATE, SAMPLES_PER_FRAME
from lipstream.engines.base import PhonemeTiming

# Feature columns of the viseme engine (one row per 40 ms frame). LABIODENTAL (f/v: the lower lip tucked
# under the upper teeth) comes from phoneme timings only: the acoustic model has no output for it.
OPEN, WIDTH, CLOSURE, LABIODENTAL = 0, 1, 2, 3
FEATURE_NAMES = ("open", "width", "closure", "labiodental")
FEATURE_DIM = len(FEATURE_NAMES)


@dataclass(frozen=True)
class Articulation:
    """Mouth pose target: open 0..1 (jaw/lips), width -1 rounded .. +1 spread, closure 0..1 (lips pressed),
    labiodental 0..1 (lower lip against the upper teeth)."""

    open: float
    width: float
    closure: float = 0.0
    labiodental: float = 0.0


REST = Articulation(0.0, 0.0, 0.0)

# Targets per IPA symbol, from standard viseme groupings (bilabial, labiodental, dental, alveolar,
# post-alveolar, velar, rounded/spread vowels by height). Values are relative, not measured.
_TABLE: dict[str, Articulation] = {}


def _put(symbols: str, open_: float, width: float, closure: float = 0.0, labiodental: float = 0.0) -> None:
    for sym in symbols.split():
        _TABLE[sym] = Articulation(open_, width, closure, labiodental)


_put("p b m", 0.0, 0.0, 1.0)
_put("f v", 0.08, 0.15, 0.0, 1.0)
_put("θ ð", 0.15, 0.1)
_put("s z", 0.1, 0.35)
_put("ʃ ʒ tʃ dʒ", 0.15, -0.45)
_put("t d n l ɾ ɫ", 0.18, 0.1)
_put("k ɡ g ŋ x", 0.22, 0.0)
_put("h ʔ", 0.3, 0.0)
_put("ɹ r ɻ", 0.15, -0.45)
_put("w ʍ", 0.1, -0.85)
_put("j", 0.15, 0.35)
_put("i ɪ ɨ", 0.25, 0.6)
_put("e ɛ", 0.45, 0.45)
_put("æ", 0.7, 0.45)
_put("a ɑ ɐ ᵻ", 0.85, 0.05)
_put("ɒ ɔ", 0.6, -0.5)
_put("ʌ ə", 0.45, 0.0)
_put("ɜ ɝ ɚ", 0.35, -0.2)
_put("ʊ", 0.3, -0.6)
_put("u ʉ", 0.2, -0.85)
_put("o", 0.5, -0.6)

# Marks that modify a neighbour and carry no pose of their own (Piper reports them with durations).
_LENGTH_MARKS = {"ː", "ˑ"}
_STRESS_MARKS = {"ˈ", "ˌ"}
# Word spaces and ties inside fluent speech: the mouth moves straight from one word to the next.
_TRANSPARENT = {" ", "␠", "‿", "͡", "-"}
# Punctuation, BOS/EOS and pauses: the mouth goes to rest.
_PAUSES = {"_", "^", "$", ",", ".", "!", "?", ";", ":", "…", "—", "_:", "", "(", ")", '"'}
# A transparent symbol lasting longer than this is a real pause.
_PAUSE_SAMPLES = int(0.12 * SAMPLE_RATE)


def articulation_of(symbol: str) -> Articulation | None:
    """Pose target of one IPA symbol (or espeak multi-letter IPA like 'aɪ'); None if it has no pose."""
    sym = symbol.strip().replace("ˈ", "").replace("ˌ", "").replace("ː", "")
    if not sym:
        return None
    if sym in _TABLE:
        return _TABLE[sym]
    # Diphthongs and affricates written as several letters: the first letter sets the pose.
    for ch in sym:
        if ch in _TABLE:
            return _TABLE[ch]
    return None


@dataclass(frozen=True)
class _Segment:
    start: int
    end: int
    pose: Articulation | None  # None: pause (mouth at rest)


def _segments(phonemes: Sequence[PhonemeTiming]) -> list[_Segment]:
    """Merge marks into their neighbours and classify every span as a pose or a pause."""
    out: list[_Segment] = []
    pending_start: int | None = None  # stress mark waiting for its vowel
    for ph in phonemes:
        sym = ph.phoneme
        if ph.end <= ph.start:
            continue
        if sym in _STRESS_MARKS:
            pending_start = ph.start if pending_start is None else pending_start
            continue
        if sym in _LENGTH_MARKS and out:
            last = out[-1]
            out[-1] = _Segment(last.start, ph.end, last.pose)
            continue
        start = pending_start if pending_start is not None else ph.start
        pending_start = None
        if sym in _TRANSPARENT and ph.end - ph.start < _PAUSE_SAMPLES:
            # Split the gap between neighbours: extend the previous segment over it.
            if out:
                last = out[-1]
                out[-1] = _Segment(last.start, ph.end, last.pose)
            continue
        pose = None if sym in _PAUSES or sym in _TRANSPARENT else articulation_of(sym)
        out.append(_Segment(start, ph.end, pose))
    return out


def frames_from_phonemes(
    phonemes: Sequence[PhonemeTiming], n_frames: int, blur_ms: float = 30.0
) -> np.ndarray:
    """Per-frame articulation [n_frames, FEATURE_DIM] from known phoneme timings (coarticulated)."""
    feats = np.zeros((n_frames, FEATURE_DIM), dtype=np.float32)
    if n_frames == 0:
        return feats
    segs = _segments(phonemes)
    if not segs:
        return feats
    centers = (np.arange(n_frames) + 0.5) * SAMPLES_PER_FRAME
    sigma = blur_ms * SAMPLE_RATE / 1000.0
    weight_sum = np.zeros(n_frames)
    targets = np.zeros((n_frames, FEATURE_DIM))
    in_bilabial = np.zeros(n_frames, dtype=bool)
    in_labiodental = np.zeros(n_frames, dtype=bool)
    for seg in segs:
        pose = seg.pose or REST
        # Overlap of the segment with a Gaussian window around each frame centre (closed form via erf).
        w = _gauss_overlap(centers, seg.start, seg.end, sigma)
        targets += w[:, None] * np.array([pose.open, pose.width, pose.closure, pose.labiodental])
        weight_sum += w
        if pose.closure >= 1.0:
            in_bilabial |= (centers >= seg.start) & (centers < seg.end)
        if pose.labiodental >= 1.0:
            in_labiodental |= (centers >= seg.start) & (centers < seg.end)
    covered = weight_sum > 1e-6
    feats[covered] = (targets[covered] / weight_sum[covered, None]).astype(np.float32)
    # Frames outside every segment (after the last phoneme) stay at rest; partly covered frames fade.
    fade = np.clip(weight_sum, 0.0, 1.0)
    feats *= fade[:, None].astype(np.float32)
    # A bilabial must actually close the lips, not just average towards closed.
    feats[in_bilabial, CLOSURE] = 1.0
    feats[in_labiodental & ~in_bilabial, LABIODENTAL] = 1.0
    feats[:, OPEN] *= 1.0 - feats[:, CLOSURE]
    return feats


def _gauss_overlap(centers: np.ndarray, start: float, end: float, sigma: float) -> np.ndarray:
    """Integral of a unit Gaussian centred on each centre over [start, end)."""
    a = (start - centers) / (sigma * np.sqrt(2.0))
    b = (end - centers) / (sigma * np.sqrt(2.0))
    return 0.5 * (erf(b) - erf(a))

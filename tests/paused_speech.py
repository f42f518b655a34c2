"""Spoken questions with a pause in the middle of a clause, made from one synthesis of the whole sentence
(so the words before the pause keep the intonation of a sentence that goes on, unlike a fragment spoken on
its own, which a TTS ends like a finished sentence). Used by the turn tests and
benchmarks/scenarios/conversation.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

RATE = 16000

# (words before the pause, words after it): the first part is never a complete question on its own
PAUSED_QUESTIONS = (
    ("Could you please tell me", "which planet in our solar system is the largest?"),
    ("What is the capital city of", "Australia?"),
    ("How long does it take to", "boil an egg?"),
    ("Can you recommend a good book for", "a long train journey?"),
    ("I would like to know why", "the sky is blue during the day."),
    ("What should I cook for dinner with", "only rice and eggs?"),
    ("Which is the fastest way to get to", "the airport from the city centre?"),
    ("Tell me something interesting about", "the moon."),
    ("Do you know a quick exercise for", "tired shoulders?"),
    ("How far is the nearest", "train station from here?"),
    ("Could you explain how", "a rainbow forms?"),
    ("What time does the library", "close on Saturday?"),
)


@dataclass(frozen=True)
class PausedQuestion:
    """16 kHz speech of `before` + `after` with `pause_s` of silence cut in between the two parts."""

    text: str
    pcm: np.ndarray
    pause_at: int  # sample where the pause starts
    pause_s: float


def _trimmed(pcm: np.ndarray, floor: float = 0.01) -> np.ndarray:
    loud = np.nonzero(np.abs(pcm) > floor)[0]
    return pcm[: loud[-1] + 1] if loud.size else pcm[:0]


def quietest_cut(pcm: np.ndarray, near: int, before_ms: float = 250, after_ms: float = 150) -> int:
    """The start of the quietest 30 ms around sample `near` (a word boundary in connected speech)."""
    win = int(0.03 * RATE)
    lo = max(win, near - int(before_ms * RATE / 1000))
    hi = min(len(pcm) - win, near + int(after_ms * RATE / 1000))
    energy = np.convolve(np.square(pcm), np.ones(win), mode="valid")
    return lo + int(np.argmin(energy[lo:hi]))


def paused_question(tts, before: str, after: str, pause_s: float) -> PausedQuestion:
    """`before after` spoken once by `tts`, cut at the word boundary after `before`, `pause_s` inserted."""
    whole = _trimmed(tts.synthesize(f"{before} {after}").pcm)
    part = _trimmed(tts.synthesize(before).pcm)
    cut = quietest_cut(whole, min(len(part), len(whole) - 1))
    pcm = np.concatenate([whole[:cut], np.zeros(int(pause_s * RATE), np.float32), whole[cut:]])
    return PausedQuestion(f"{before} {after}", pcm.astype(np.float32), cut, pause_s)

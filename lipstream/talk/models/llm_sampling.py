"""Picking the next token from a sequence's logits, in numpy: the chain llama-cpp-python's chat completion
uses (repetition penalty, top-k 40, top-p, min-p 0.05, temperature, a draw), so several answers decoded in
one batch each keep their own penalty window and random stream."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

TOP_K = 40
MIN_P = 0.05
PENALTY_WINDOW = 64  # the answer's last tokens the repetition penalty looks at (llama-cpp-python's default)


@dataclass(frozen=True)
class SamplingConfig:
    """How the model picks tokens: low temperature plus a repetition penalty (a 135M model loops without)."""

    temperature: float = 0.3
    top_p: float = 0.9
    repeat_penalty: float = 1.2


def next_token(
    logits: np.ndarray, written: Sequence[int], sampling: SamplingConfig, rng: np.random.Generator
) -> int:
    """The token to write after `logits`, given the answer's tokens so far (`written`, the prompt excluded:
    penalising the prompt's words would keep the model from quoting its notes)."""
    scores = np.array(logits, dtype=np.float64)
    recent = np.unique(np.asarray(written[-PENALTY_WINDOW:], dtype=np.int64))
    if recent.size and sampling.repeat_penalty != 1.0:
        seen = scores[recent]
        scores[recent] = np.where(seen > 0, seen / sampling.repeat_penalty, seen * sampling.repeat_penalty)
    if sampling.temperature <= 0:
        return int(np.argmax(scores))
    top = np.argpartition(-scores, TOP_K)[:TOP_K]
    top = top[np.argsort(-scores[top], kind="stable")]
    kept = scores[top]
    probs = np.exp(kept - kept[0])
    probs /= probs.sum()
    # top-p: the fewest tokens whose probability reaches top_p (the first always stays)
    keep = int(np.searchsorted(np.cumsum(probs), sampling.top_p) + 1)
    # min-p: tokens at least MIN_P as likely as the likeliest
    keep = min(keep, int(np.count_nonzero(probs >= MIN_P * probs[0])))
    top, kept = top[: max(1, keep)], kept[: max(1, keep)]
    weights = np.exp((kept - kept[0]) / sampling.temperature)
    return int(top[rng.choice(len(top), p=weights / weights.sum())])

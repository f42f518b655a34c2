"""The sentences a live session's utterances said and where they started: what a listener heard of one."""

from __future__ import annotations

from collections import deque

KEEP_SENTENCES = 256  # the last few minutes of speech: an interrupt asks about the utterance playing now


class SpokenText:
    """Each sentence's utterance, first pts, length in samples and text, as its first frame goes out."""

    def __init__(self, keep: int = KEEP_SENTENCES) -> None:
        """Remember the last `keep` sentences."""
        self._said: deque[tuple[int, int, int, str]] = deque(maxlen=keep)  # (utterance, pts, samples, text)

    def said(self, utterance_id: int, pts: int, samples: int, text: str) -> None:
        """A sentence of `samples` samples starts playing at `pts`."""
        self._said.append((utterance_id, pts, samples, text))

    def heard(self, utterance_id: int, until_pts: int) -> str:
        """What an utterance said before pts `until_pts` (its sentences, the last one cut in proportion to
        the part played)."""
        words: list[str] = []
        for uid, pts, samples, text in self._said:
            if uid != utterance_id or pts >= until_pts:
                continue
            sentence = text.split()
            played = 1.0 if samples <= 0 else min(1.0, (until_pts - pts) / samples)
            words += sentence[: int(round(len(sentence) * played))]
        return " ".join(words)

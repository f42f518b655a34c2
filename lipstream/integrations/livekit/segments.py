"""The agent's audio as it was pushed, kept per segment so each video frame hands back exactly its own
samples at the pushed rate (the Session itself works on a 16 kHz copy).

Frame j of a segment covers samples [round(j*R/25), round((j+1)*R/25)) at rate R (960 per frame at
24 kHz); the segment's last frame takes whatever is left, so the concatenated output equals the input
sample for sample. Pure bookkeeping: no LiveKit import, no clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from lipstream.audio.timeline import FPS


@dataclass
class SegmentAudio:
    """One segment's pushed audio (interleaved int16, as received) and how much of it went out."""

    sample_rate: int
    channels: int
    chunks: list[np.ndarray] = field(default_factory=list)  # (samples, channels) int16 blocks
    received: int = 0  # samples per channel pushed so far
    sent: int = 0  # samples per channel handed back so far
    frames: int = 0  # video frames of this segment handed back so far
    closed: bool = False  # the segment's end was pushed

    def append(self, pcm: np.ndarray, sample_rate: int, channels: int) -> None:
        """Add interleaved int16 audio; a segment keeps one rate and channel count (`refusal` says)."""
        assert (sample_rate, channels) == (self.sample_rate, self.channels)
        block = pcm.reshape(-1, channels)
        self.chunks.append(block)
        self.received += len(block)

    def take_frame(self, last: bool) -> np.ndarray:
        """The samples of the next video frame (all that is left when `last`): (n, channels) int16."""
        self.frames += 1
        end = self.received if last else min(self.received, round(self.frames * self.sample_rate / FPS))
        return self._take(max(end, self.sent))

    def take_rest(self) -> np.ndarray:
        """Whatever was pushed and not yet handed back."""
        return self._take(self.received)

    def _take(self, end: int) -> np.ndarray:
        count = end - self.sent
        self.sent = end
        if count <= 0:
            return np.zeros((0, self.channels), np.int16)
        out, need = [], count
        while need > 0:
            block = self.chunks[0]
            if len(block) <= need:
                out.append(self.chunks.pop(0))
                need -= len(block)
            else:
                out.append(block[:need])
                self.chunks[0] = block[need:]
                need = 0
        return np.concatenate(out)


class SegmentLedger:
    """Segments in push order, bound to the Session's utterances as their first frames come out.

    The Session numbers utterances itself; segments and utterances are both strictly sequential, so the
    first speaking frame of an utterance id not seen before belongs to the oldest unbound segment."""

    def __init__(self) -> None:
        self._unbound: deque[SegmentAudio] = deque()
        self._bound: dict[int, SegmentAudio] = {}
        self.open: SegmentAudio | None = None  # the segment audio is being pushed into

    def push(self, pcm: np.ndarray, sample_rate: int, channels: int) -> None:
        """Audio for the open segment (a new one starts with the first chunk after an end)."""
        if self.open is None:
            self.open = SegmentAudio(sample_rate, channels)
            self._unbound.append(self.open)
        self.open.append(pcm, sample_rate, channels)

    def refusal(self, sample_rate: int, channels: int) -> str | None:
        """Why audio of this format cannot join the open segment (None: it can)."""
        segment = self.open
        if segment is None or (segment.sample_rate, segment.channels) == (sample_rate, channels):
            return None
        was = f"{segment.sample_rate} Hz x{segment.channels}"
        return (
            f"audio changed from {was} to {sample_rate} Hz x{channels} inside one segment; "
            "send one format per segment (end the segment first)"
        )

    def close(self) -> bool:
        """End the open segment; False when none was open (nothing was pushed since the last end)."""
        if self.open is None:
            return False
        self.open.closed = True
        self.open = None
        return True

    def for_utterance(self, utterance_id: int) -> SegmentAudio | None:
        """The segment an utterance plays (bound on its first frame)."""
        segment = self._bound.get(utterance_id)
        if segment is None and self._unbound:
            segment = self._bound[utterance_id] = self._unbound.popleft()
        return segment

    def finish(self, utterance_id: int) -> SegmentAudio | None:
        """Forget a played utterance's segment and return it (None if it never produced a frame)."""
        return self._bound.pop(utterance_id, None)

    def clear(self) -> None:
        """Drop everything (an interruption)."""
        self._unbound.clear()
        self._bound.clear()
        self.open = None

    @property
    def pending(self) -> bool:
        """Some pushed audio has not finished playing."""
        return bool(self._unbound or self._bound)

"""Whisper's encoder on the audio's own length, not always 30 s (issue 35: the transcript at human pace).

faster-whisper pads every window's log-mel to 3,000 frames (30 s) with zeros before the encoder, whose cost
is then the same for a 2 s question as for 30 s of speech: ~1.2 s of the ~1.4 s a turn's transcript took on
a 2-core AMD EPYC. CTranslate2's Whisper encoder accepts fewer frames. Cut to the audio plus 1 s, and never
under 5 s, a question's decode takes ~75 ms instead of ~1.2 s (benchmarks/stt_window_bench.py measures the
windows side by side). Under ~10 s of context the decoder sometimes loops back to the start of what it has
written ("Hello? Hello?", "What time does the library open? What time does the"): `without_loop` cuts such
a repeat, which leaves the short window's word error rate no worse than 10 s's, and `max_new_tokens` bounds
the loop's cost. A decode primed with the text before it (streaming recognition's tail) garbled a short tail
on the audio's own window, so such decodes read the whole window (`whole_window()`).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from lipstream.talk.text import bare_word

FULL_FRAMES = 3000  # what faster-whisper pads to: 30 s of 10 ms log-mel frames
MARGIN_FRAMES = 100  # audio context after the last frame of audio
MIN_FRAMES = 500  # the shortest context (5 s): 4 s and less misheard more words (measured, see the module)


def content_frames(features: np.ndarray) -> int:
    """Frames up to the last one that is not zero padding (faster-whisper pads the log-mel with zeros)."""
    columns = np.flatnonzero(np.any(features.reshape(-1, features.shape[-1]) != 0, axis=0))
    return int(columns[-1]) + 1 if columns.size else 1


def context_frames(content: int, full: int = FULL_FRAMES, minimum: int = MIN_FRAMES) -> int:
    """The encoder's window for `content` frames of audio: the audio plus a margin, in whole seconds."""
    wanted = -(-(content + MARGIN_FRAMES) // 100) * 100
    return min(full, max(minimum, wanted))


def max_new_tokens(seconds: float) -> int:
    """A bound on the tokens `seconds` of speech can need (fast speech is ~4 tokens/s)."""
    return min(220, int(8 * seconds) + 16)


def loop_start(words: list[str]) -> int | None:
    """Where a decode that loops back to its own start begins its repeat ("Hello? Hello?" -> 1, "What time
    is it? What time" -> 4), or None. The repeat runs to the end; its last word may be cut short ("What time
    is it? What ti"). One word repeated is a loop only after a one-word start ("Hello? Hello?", not "What is
    what"); a phrase repeated later ("Hello? Hello? Are you there?") is none."""
    bare = [bare_word(word) for word in words]
    for start in range(1, len(words)):
        tail, head = bare[start:], bare[: len(words) - start]
        if not all(head) or not tail[-1]:
            continue
        if len(tail) == 1 and start == 1 and tail == head:
            return start
        if len(tail) > 1 and tail[:-1] == head[:-1] and head[-1].startswith(tail[-1]):
            return start
    return None


def without_loop(text: str) -> str:
    """The text up to where the decoder looped back to its start (`loop_start`); other text unchanged."""
    words = text.split()
    start = loop_start(words)
    return text if start is None else " ".join(words[:start])


def windowed_whisper(model_path: str, min_frames: int = MIN_FRAMES, **options: Any):  # noqa: ANN201
    """A faster-whisper WhisperModel whose encoder sees only the audio's own window, never under `min_frames`
    (see the module)."""
    from faster_whisper import WhisperModel

    class WindowedWhisperModel(WhisperModel):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._whole = threading.local()  # decodes run in their callers' threads, several at once

        @contextmanager
        def whole_window(self) -> Iterator[None]:
            """Decodes in this thread, inside the block, read Whisper's whole 30 s window."""
            self._whole.on = True
            try:
                yield
            finally:
                self._whole.on = False

        def encode(self, features: np.ndarray):  # noqa: ANN202 - a ctranslate2.StorageView
            if getattr(self._whole, "on", False):
                return super().encode(features)
            frames = features if features.ndim == 3 else features[None]
            window = context_frames(content_frames(frames), frames.shape[-1], min_frames)
            return super().encode(np.ascontiguousarray(frames[..., :window]))

    return WindowedWhisperModel(model_path, **options)

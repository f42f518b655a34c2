"""Streaming voice activity detection on silero-vad's bundled ONNX model (16 kHz, 32 ms windows)."""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.errors import ModelError

WINDOW = 512  # samples per window at 16 kHz (32 ms): the only size the model accepts at this rate
CONTEXT = 64  # the model also sees the last 64 samples of the previous window
WINDOW_MS = WINDOW * 1000 / SAMPLE_RATE
# the conversation's defaults (ConversationConfig reads them from here): speech shorter than START_MS never
# starts a turn; PAUSE_MS of silence is a pause (an answer starts being prepared); END_SILENCE_MS ends it
START_MS = 200.0
PAUSE_MS = 96.0
END_SILENCE_MS = 500.0

VadKind = Literal["speech_start", "pause", "resume", "speech_end"]


@dataclass(frozen=True)
class VadEvent:
    """A change in the user's speech; `sample` is where in the stream it happened, not when it was detected.

    - speech_start: ≥ start_ms of speech; `sample` = where that speech began.
    - pause: speech followed by ≥ pause_ms of silence, the end is not confirmed yet (an end-of-speech
      candidate: start speculative work here); `sample` = where the silence began.
    - resume: speech again after a `pause` and before `speech_end` (drop the speculative work).
    - speech_end: end_silence_ms of silence after speech; `sample` = where the silence began.
    """

    kind: VadKind
    sample: int


def bundled_model_path() -> Path:
    """The silero-vad ONNX graph that ships inside the `silero-vad` package."""
    # find_spec does not run the package's __init__, which imports torch (seconds) for its own helpers.
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("voice activity detection needs the silero-vad package: pip install silero-vad")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "silero_vad.onnx"
    if not path.is_file():
        raise ModelError(f"silero-vad's ONNX model is missing at {path}; reinstall silero-vad")
    return path


class SileroModel:
    """The silero-vad ONNX graph: stateless (state is passed in and out), so one instance serves many
    detectors and threads (onnxruntime's `run` is thread-safe)."""

    def __init__(self, path: str | Path | None = None, threads: int = 1) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        # One thread: a 32 ms window costs well under a millisecond, and more threads only add wake-ups
        # that compete with STT/TTS/render for the same cores.
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.path = Path(path) if path is not None else bundled_model_path()
        self._session = onnxruntime.InferenceSession(
            str(self.path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)

    @staticmethod
    def initial_state() -> np.ndarray:
        """The recurrent state of a fresh stream."""
        return np.zeros((2, 1, 128), dtype=np.float32)

    def __call__(self, window: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        """Speech probability of one window ([CONTEXT + WINDOW] float32) and the next state."""
        prob, new_state = self._session.run(
            None, {"input": window.reshape(1, -1), "state": state, "sr": self._sr}
        )
        return float(prob[0, 0]), new_state


class VoiceActivityDetector:
    """Streaming VAD for one audio stream: push 16 kHz float32 PCM in any chunk size, get VadEvents.

    A window is speech when its probability is ≥ `threshold`, silence when it is < `threshold - 0.15`
    (hysteresis, as silero's own segmenter does), and keeps the previous state in between. Speech starts
    after `start_ms` of speech with no silence gap longer than `gap_ms` (so a click or cough shorter than
    start_ms never starts a turn); it ends after `end_silence_ms` of silence. Reported ends are moved
    `end_offset_ms` earlier, because the model's probability lags the voice by about one window.
    Not thread-safe: one detector per stream, fed from one task.
    """

    def __init__(
        self,
        threshold: float = 0.5,
        start_ms: float = START_MS,
        end_silence_ms: float = END_SILENCE_MS,
        pause_ms: float = PAUSE_MS,
        gap_ms: float = 96,
        end_offset_ms: float = WINDOW_MS,
        model: SileroModel | None = None,
    ) -> None:
        if not 0 < threshold < 1:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        if pause_ms >= end_silence_ms:
            raise ValueError("pause_ms must be shorter than end_silence_ms")
        self.threshold = threshold
        self.neg_threshold = max(0.01, threshold - 0.15)
        self.start_windows = max(1, math.ceil(start_ms / WINDOW_MS))
        self.end_windows = max(1, math.ceil(end_silence_ms / WINDOW_MS))
        self.pause_windows = max(1, math.ceil(pause_ms / WINDOW_MS))
        self.gap_windows = max(1, math.ceil(gap_ms / WINDOW_MS))
        self.end_offset = int(end_offset_ms * SAMPLE_RATE / 1000)
        # A SileroModel is stateless: pass one to share it between detectors (building one takes ≈30 ms).
        self.model = model if model is not None else SileroModel()
        self.reset()

    def reset(self) -> None:
        """Forget everything: a new stream starting at sample 0."""
        self._state = self.model.initial_state()
        self._context = np.zeros(CONTEXT, dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)
        self._position = 0  # samples consumed by windows so far
        self._speaking = False  # the current window's hysteresis state
        self.in_speech = False
        self.speech_probability = 0.0
        self.speech_started_at: int | None = None
        self.silence_started_at: int | None = None  # during a turn: where the current silence began
        self._candidate_start: int | None = None
        self._candidate_speech = 0  # speech windows in the candidate
        self._candidate_gap = 0  # trailing silence windows in the candidate
        self._silence_windows = 0
        self._paused = False
        self._voiced_end = 0  # end of the last window at or above `threshold`

    @property
    def position(self) -> int:
        """Stream samples analysed so far (pushed samples minus the < 512 still waiting for a window)."""
        return self._position

    @property
    def speaking(self) -> bool:
        """The last window was voiced (with hysteresis); `in_speech` also covers the pause before an end."""
        return self._speaking

    def push(self, pcm: np.ndarray) -> list[VadEvent]:
        """Add PCM (float32 in [-1, 1], or int16) at 16 kHz; return the events it caused, in order."""
        pcm = np.asarray(pcm)
        if pcm.dtype == np.int16:
            pcm = pcm.astype(np.float32) / 32768.0
        pcm = pcm.astype(np.float32, copy=False).reshape(-1)
        buf = np.concatenate([self._pending, pcm]) if len(self._pending) else pcm
        events: list[VadEvent] = []
        n_windows = len(buf) // WINDOW
        for i in range(n_windows):
            window = buf[i * WINDOW : (i + 1) * WINDOW]
            self._window(window, events)
        self._pending = buf[n_windows * WINDOW :].copy()
        return events

    def _window(self, window: np.ndarray, events: list[VadEvent]) -> None:
        x = np.concatenate([self._context, window])
        prob, self._state = self.model(x, self._state)
        self._context = window[-CONTEXT:]
        start = self._position
        self._position += WINDOW
        self.speech_probability = prob
        if prob >= self.threshold:
            self._speaking = True
            self._voiced_end = self._position
        elif prob < self.neg_threshold:
            self._speaking = False
        if self.in_speech:
            self._track_turn(start, events)
        else:
            self._track_candidate(start, events)

    def _track_candidate(self, start: int, events: list[VadEvent]) -> None:
        if self._speaking:
            if self._candidate_start is None:
                self._candidate_start = start
            self._candidate_speech += 1
            self._candidate_gap = 0
            if self._candidate_speech >= self.start_windows:
                self.in_speech = True
                self.speech_started_at = self._candidate_start
                self._clear_candidate()
                self._silence_windows = 0
                self.silence_started_at = None
                self._paused = False
                events.append(VadEvent("speech_start", self.speech_started_at))
        elif self._candidate_start is not None:
            self._candidate_gap += 1
            if self._candidate_gap > self.gap_windows:
                self._clear_candidate()

    def _clear_candidate(self) -> None:
        self._candidate_start = None
        self._candidate_speech = 0
        self._candidate_gap = 0

    def _track_turn(self, start: int, events: list[VadEvent]) -> None:
        if self._speaking:
            if self._paused:
                events.append(VadEvent("resume", start))
            self._silence_windows = 0
            self.silence_started_at = None
            self._paused = False
            return
        if self._silence_windows == 0:
            # The model keeps p ≈ 1 for about one window after the voice stops (measured on Piper speech:
            # ends reported 60-90 ms late without this), so the silence began `end_offset` earlier.
            began = min(start, self._voiced_end) - self.end_offset
            self.silence_started_at = max(began, self.speech_started_at or 0)
        self._silence_windows += 1
        assert self.silence_started_at is not None
        if not self._paused and self._silence_windows >= self.pause_windows:
            self._paused = True
            events.append(VadEvent("pause", self.silence_started_at))
        if self._silence_windows >= self.end_windows:
            events.append(self._finish_turn())

    def _finish_turn(self) -> VadEvent:
        assert self.silence_started_at is not None
        event = VadEvent("speech_end", self.silence_started_at)
        self.in_speech = False
        self._paused = False
        self._silence_windows = 0
        self.speech_started_at = None
        # silence_started_at stays: where the last turn's speech ended
        return event

    @property
    def silence_ms(self) -> float:
        """How long the silence in the open turn has lasted (0 while speech goes on, or outside a turn)."""
        if not self.in_speech or self._silence_windows == 0:
            return 0.0
        return self._silence_windows * WINDOW_MS

    def end_turn(self) -> VadEvent | None:
        """End the open turn now, in its silence (a turn detector judged it finished): the `speech_end`
        event, or None when there is no turn or the user is speaking again."""
        if not self.in_speech or self._silence_windows == 0:
            return None
        return self._finish_turn()

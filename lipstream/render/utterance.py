"""One utterance on its way through a live session: its audio and feature rows until they become frames."""

from __future__ import annotations

import time
from collections import deque

import numpy as np

from lipstream.audio.levels import SilenceDetector, frame_rms
from lipstream.audio.timeline import SAMPLES_PER_FRAME
from lipstream.engines.base import Engine, FeatureStream, Speech


class Utterance:
    """One utterance's input and its progress through the renderer.

    Only what is not yet produced is kept (audio from frame `emitted` on, feature rows not yet taken), so
    a long live utterance costs the same per push as a short one."""

    def __init__(self, uid: int, engine: Engine, silence: SilenceDetector, kind: str) -> None:
        self.id = uid
        self.kind = kind  # "stream" (push_audio chunks) or "text" (TTS sentences)
        self._pcm = np.zeros(0, dtype=np.float32)  # audio of frames emitted.. onwards
        self._samples = 0  # samples received in all
        self._features: list[np.ndarray] = []  # final feature rows not yet taken, in chunks
        self.feature_rows = 0  # final feature rows in all
        self.stream: FeatureStream | None = None
        self.engine = engine
        self.silence = silence
        self.flushed = False
        self.emitted = 0  # frames of this utterance already produced
        self.first_push = time.perf_counter()
        self.started = False
        # (sample offset in the utterance, samples it lasts, the text said there)
        self.marks: deque[tuple[int, int, str]] = deque()

    def _append_audio(self, pcm: np.ndarray) -> None:
        self._pcm = np.concatenate([self._pcm, pcm])
        self._samples += len(pcm)

    def append_pcm(self, pcm: np.ndarray) -> None:
        """Streaming input: add audio and pull any features that became final."""
        self.append_segment(pcm, self.stream_features(pcm))

    def stream_features(self, pcm: np.ndarray) -> np.ndarray:
        """Feature rows that `pcm`, the next chunk of streamed audio, makes final (may run on a worker;
        `append_segment` then adds chunk and rows on the event loop)."""
        if self.stream is None:
            self.stream = self.engine.stream_features()
        return np.asarray(self.stream.push(pcm), dtype=np.float32)

    def segment(self, speech: Speech) -> tuple[np.ndarray, np.ndarray]:
        """Audio padded to whole frames and its features, for a whole segment (a TTS sentence with
        phoneme timings). Pure, so it can run on a worker thread; `append_segment` then adds it."""
        pad = (-len(speech.pcm)) % SAMPLES_PER_FRAME
        pcm = np.concatenate([speech.pcm, np.zeros(pad, dtype=np.float32)])
        seg = Speech(pcm=pcm, phonemes=speech.phonemes, text=speech.text, source=speech.source)
        feats = np.asarray(self.engine.features(seg), dtype=np.float32)[: seg.frame_count]
        if len(feats) < seg.frame_count:
            feats = pad_rows(feats, seg.frame_count, self.engine.feature_dim)
        return pcm, feats

    def append_segment(
        self, pcm: np.ndarray, feats: np.ndarray, text: str | None = None, text_samples: int | None = None
    ) -> None:
        """Add a segment made by `segment` (on the event loop, where the producer reads the utterance);
        `text`, when given, is what the segment says (over `text_samples` when it goes on into later
        segments): it becomes a `text` event at its first frame."""
        if text:
            self.marks.append((self._samples, text_samples or len(pcm), text))
        self._append_audio(pcm)
        self._add_features(feats)

    def take_marks(self, first_tick: int, count: int) -> list[tuple[int, int, str]]:
        """(tick, samples, text) of the marks starting in the `count` frames just taken, which play from
        `first_tick`."""
        start = self.emitted - count  # utterance frame of first_tick
        due = []
        while self.marks and self.marks[0][0] < self.emitted * SAMPLES_PER_FRAME:
            offset, samples, text = self.marks.popleft()
            due.append((first_tick + max(0, offset // SAMPLES_PER_FRAME - start), samples, text))
        return due

    def flush(self) -> None:
        """No more input: pad the audio to a whole frame and finish the feature stream."""
        if self.flushed:
            return
        self.flushed = True
        pad = (-self._samples) % SAMPLES_PER_FRAME
        if pad:
            tail = np.zeros(pad, dtype=np.float32)
            self._append_audio(tail)
            if self.stream is not None:
                self._add_features(self.stream.push(tail))
        if self.stream is not None:
            self._add_features(self.stream.finish())
        total = self.total_frames
        if self.feature_rows < total:
            self._add_features(np.zeros((total - self.feature_rows, self.engine.feature_dim), np.float32))

    def _add_features(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=np.float32)
        if rows.size:
            self._features.append(rows.reshape(len(rows), -1))
            self.feature_rows += len(rows)

    @property
    def samples(self) -> int:
        """Samples of audio received so far."""
        return self._samples

    @property
    def pending_samples(self) -> int:
        """Samples received but not yet produced as frames."""
        return max(0, self._samples - self.emitted * SAMPLES_PER_FRAME)

    @property
    def total_frames(self) -> int:
        """Frames of audio received so far (whole frames)."""
        return self._samples // SAMPLES_PER_FRAME

    def ready_frames(self) -> int:
        """Frames that have both audio and final features and are not yet produced."""
        return max(0, min(self.total_frames, self.feature_rows) - self.emitted)

    @property
    def done(self) -> bool:
        """Everything received has been produced and no more is coming."""
        return self.flushed and self.emitted >= self.total_frames

    def take(self, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Features, audio and speaking mask of the next `count` ready frames (dropped from the buffers)."""
        pending = np.concatenate(self._features) if len(self._features) > 1 else self._features[0]
        feats, rest = pending[:count], pending[count:]
        self._features = [rest] if len(rest) else []
        split = count * SAMPLES_PER_FRAME
        audio, self._pcm = self._pcm[:split], self._pcm[split:]
        speaking = ~self.silence.mask_from_levels(frame_rms(audio))
        self.emitted += count
        return feats, audio, speaking


def pad_rows(rows: np.ndarray, n: int, dim: int) -> np.ndarray:
    """`rows` in an (n, dim) float32 array, zero rows after them (a segment whose features came up short)."""
    out = np.zeros((n, dim), dtype=np.float32)
    out[: len(rows)] = rows.reshape(len(rows), -1)[:, :dim]
    return out

"""Speech -> per-frame articulation: known phoneme timings, or the acoustic model, then silence gating."""

from __future__ import annotations

import numpy as np

from lipstream.audio.levels import SilenceDetector, frame_rms
from lipstream.audio.timeline import SAMPLES_PER_FRAME, frame_count
from lipstream.engines.base import Speech
from lipstream.engines.viseme.acoustic import AcousticFrontEnd
from lipstream.engines.viseme.articulation import FEATURE_DIM, frames_from_phonemes
from lipstream.engines.viseme.loudness import (
    ClosureGate,
    LoudnessConfig,
    ease_to_rest,
    loudness,
    scale_opening,
)
from lipstream.engines.viseme.model import ArticulationModel

# Light temporal smoothing of the model output (one frame each side) against frame-to-frame jitter.
_SMOOTH = np.array([0.25, 0.5, 0.25], dtype=np.float32)


class ArticulationExtractor:
    """Computes articulation rows for any span of frames using only nearby audio (so it can stream)."""

    def __init__(
        self,
        model: ArticulationModel,
        silence: SilenceDetector | None = None,
        loud: LoudnessConfig | None = None,
        closure_gate: ClosureGate | None = None,
    ) -> None:
        self.model = model
        self.silence = silence or SilenceDetector()
        self.loud = loud or LoudnessConfig()
        self.closure_gate = closure_gate or ClosureGate()
        self.front_end = AcousticFrontEnd(model.acoustic)
        if self.loud.ahead_frames > self.lookahead_frames:
            raise ValueError("the loudness reference may not look further ahead than the extractor")

    @property
    def lookahead_frames(self) -> int:
        """Frame k needs audio up to frame k + this (model context + smoothing + analysis overhang)."""
        return max(self.model.after + 2, self.silence.min_silent_frames - 1 + self.loud.ease_frames)

    @property
    def lookback_frames(self) -> int:
        """Frame k needs audio from frame k - this."""
        return max(self.model.before + 2, self.silence.min_silent_frames - 1, self.loud.back_frames)

    def from_speech(self, speech: Speech, use_phonemes: bool = True) -> np.ndarray:
        """Whole-utterance articulation [speech.frame_count, FEATURE_DIM]."""
        n = speech.frame_count
        if use_phonemes and speech.phonemes:
            feats = frames_from_phonemes(speech.phonemes, n)
            return self._finish(speech.pcm, feats, 0, n, n)
        return self.span(speech.pcm, 0, n, n)

    def span(
        self, pcm: np.ndarray, k0: int, k1: int, frames_known: int, offset_frames: int = 0
    ) -> np.ndarray:
        """Articulation of frames [k0, k1) from the acoustic model; pcm starts at frame offset_frames."""
        if k1 <= k0:
            return np.zeros((0, FEATURE_DIM), dtype=np.float32)
        m = self.model
        # Model outputs for k0-1 .. k1 (one extra each side for smoothing) need acoustic rows around them.
        a0 = k0 - 1 - m.before
        a1 = k1 + 1 + m.after
        acoustic = self.front_end.frames(pcm, a0 - offset_frames, a1 - a0)
        raw = m.predict(acoustic)  # rows for k0-1 .. k1
        smooth = _SMOOTH[0] * raw[:-2] + _SMOOTH[1] * raw[1:-1] + _SMOOTH[2] * raw[2:]  # rows for k0 .. k1-1
        # the shipped model gives open, width, closure: the f/v cue (LABIODENTAL) then comes from phoneme
        # timings only (scripts/train_viseme_model.py --labiodental trains a model with that output too)
        smooth = np.pad(smooth.astype(np.float32), ((0, 0), (0, FEATURE_DIM - smooth.shape[1])))
        return self._finish(pcm, smooth, k0, k1, frames_known, offset_frames)

    def _finish(
        self,
        pcm: np.ndarray,
        feats: np.ndarray,
        k0: int,
        k1: int,
        frames_known: int,
        offset_frames: int = 0,
    ) -> np.ndarray:
        """Gate closures, scale the opening by loudness, ease into silence and close the lips there."""
        e = self.loud.ease_frames
        pad = self.silence.min_silent_frames - 1 + e
        l0 = max(k0 - max(pad, self.loud.back_frames), offset_frames, 0)
        l1 = min(k1 + max(pad, self.loud.ahead_frames), frames_known)
        s0 = (l0 - offset_frames) * SAMPLES_PER_FRAME
        s1 = (l1 - offset_frames) * SAMPLES_PER_FRAME
        levels = frame_rms(pcm[s0:s1])
        rows = slice(k0 - l0, k0 - l0 + (k1 - k0))
        loud = loudness(levels, self.loud)[rows]
        # Also for TTS timings: lips cannot be shut on a frame as loud as a vowel; such a frame is the
        # alignment's 40 ms rounding into the neighbouring vowel.
        feats = self.closure_gate.apply(feats, loud)
        out = scale_opening(feats, loud, self.loud)
        # Silence around the rows, padded with "speech" beyond the known audio (nothing to ease into).
        silent = np.concatenate([np.zeros(e, bool), self.silence.mask_from_levels(levels), np.zeros(e, bool)])
        return ease_to_rest(out, silent[rows.start : rows.stop + 2 * e], self.loud)


class StreamingArticulation:
    """FeatureStream: push 16 kHz PCM, get the rows that became final (at most lookahead_frames late)."""

    def __init__(self, extractor: ArticulationExtractor) -> None:
        self._ex = extractor
        self._chunks: list[np.ndarray] = []
        self._buffer = np.zeros(0, dtype=np.float32)
        self._offset_frames = 0  # frame index of the buffer's first sample
        self._total_samples = 0
        self._done = 0  # frames already returned

    def push(self, pcm: np.ndarray) -> np.ndarray:
        """Add 16 kHz float32 PCM; return features [k, FEATURE_DIM] for frames that became final."""
        pcm = np.asarray(pcm, dtype=np.float32).reshape(-1)
        self._chunks.append(pcm)
        self._total_samples += pcm.size
        known = frame_count(self._total_samples)
        ready = known - self._ex.lookahead_frames
        if ready <= self._done:
            return np.zeros((0, FEATURE_DIM), dtype=np.float32)
        return self._emit(ready, known)

    def finish(self) -> np.ndarray:
        """End of utterance: return the features of every remaining frame."""
        known = frame_count(self._total_samples)
        return self._emit(known, known)

    def _emit(self, upto: int, known: int) -> np.ndarray:
        if self._chunks:
            self._buffer = np.concatenate([self._buffer, *self._chunks])
            self._chunks = []
        if upto <= self._done:
            return np.zeros((0, FEATURE_DIM), dtype=np.float32)
        rows = self._ex.span(self._buffer, self._done, upto, known, self._offset_frames)
        self._done = upto
        # Keep only the audio later frames can still need.
        keep_from = max(self._done - self._ex.lookback_frames - 1, 0)
        drop = keep_from - self._offset_frames
        if drop > 0:
            self._buffer = self._buffer[drop * SAMPLES_PER_FRAME :]
            self._offset_frames = keep_from
        return rows

"""MuseTalk audio features: Whisper encoder states stacked and windowed per 40 ms video frame.

Upstream's recipe (reference/musetalk.md §4): 16 kHz audio is cut into 30 s segments; each goes through
WhisperFeatureExtractor (padded to 30 s) and the encoder; the embedding output and every layer's output
(the last one after the final LayerNorm) are stacked -> [1500, S, D] per segment at 50 Hz. The
concatenation is truncated to floor(samples / 320) steps. Video frame f takes steps [2f-4, 2f+6), zeros
outside, flattened time-major to 10*S*D values (50x384 = 19200 for whisper-tiny).
MuseTalk v1.0 was trained on an older Whisper path (openai-whisper's AudioEncoder with include_embeddings)
whose last stacked state is layer 4's output BEFORE the final LayerNorm; `last_state_pre_norm` selects it.
No cv2/av imports: the GPU benchmark uses this module on a bare machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lipstream.audio.timeline import SAMPLE_RATE, frame_count

SEGMENT_SAMPLES = 30 * SAMPLE_RATE  # one Whisper context: 30 s
SAMPLES_PER_STEP = SAMPLE_RATE // 50  # encoder steps are 20 ms
STEPS_PER_FRAME = 2  # 50 Hz steps per 25 fps frame
WINDOW_STEPS = 10  # 2 * (left 2 + right 2 + 1)
WINDOW_START = -4  # frame f starts at step 2f - 4: a 200 ms window centred on the frame's 40 ms
LOOKAHEAD_FRAMES = 2  # frame f's window ends at step 2f+6 = the end of frame f+2


def encoder_steps(n_samples: int) -> int:
    """Encoder steps that cover n_samples (upstream's floor(seconds * 50))."""
    return max(0, n_samples) // SAMPLES_PER_STEP


def window_steps(frame: int) -> np.ndarray:
    """The 10 encoder-step indices (at 50 Hz) frame `frame` reads; negative ones are zero padding."""
    start = STEPS_PER_FRAME * frame + WINDOW_START
    return np.arange(start, start + WINDOW_STEPS)


def frame_windows(
    states: np.ndarray, first_frame: int, n_frames: int, total_steps: int, states_offset: int = 0
) -> np.ndarray:
    """Windowed features [n_frames, 10*S*D] of frames first_frame.. from states [L, S, D].

    `states` holds encoder steps [states_offset, states_offset + L); steps outside [0, total_steps) read as 0.
    """
    _, n_states, dim = states.shape
    frames = np.arange(first_frame, first_frame + n_frames)
    steps = STEPS_PER_FRAME * frames[:, None] + WINDOW_START + np.arange(WINDOW_STEPS)  # [n, 10]
    valid = (steps >= 0) & (steps < total_steps)
    local = steps - states_offset
    held = (local >= 0) & (local < len(states))
    if np.any(valid & ~held):
        raise ValueError(
            f"frames from {first_frame} need steps not held (offset {states_offset}, {len(states)} held)"
        )
    zero_row = len(states)  # gather from one appended row of zeros where the window leaves the audio
    padded = np.concatenate([states.astype(np.float32, copy=False), np.zeros((1, n_states, dim), np.float32)])
    out = padded[np.where(valid, local, zero_row)]  # [n, 10, S, D]
    return out.reshape(n_frames, WINDOW_STEPS * n_states * dim)


def last_state_pre_norm(version: str) -> bool:
    """Whether a MuseTalk version's UNet was trained on a pre-LayerNorm last state (v1.0) or not (v1.5)."""
    return version == "1.0"


def stacked_states(encoder: Any, mel: torch.Tensor, pre_norm_last: bool = False) -> torch.Tensor:
    """Encoder states [B, 1500, S, D]: embedding, then each layer's output (the last one normed unless
    `pre_norm_last`). Plain torch ops only: the ONNX export traces this same function."""
    captured: list[torch.Tensor] = []
    hook = None
    if pre_norm_last:
        hook = encoder.layers[-1].register_forward_hook(
            lambda module, args, output: captured.append(output[0] if isinstance(output, tuple) else output)
        )
    try:
        hidden = list(encoder(mel, output_hidden_states=True).hidden_states)
    finally:
        if hook is not None:
            hook.remove()
    if pre_norm_last:
        hidden[-1] = captured[-1]
    return torch.stack(hidden, dim=2)


@dataclass
class WhisperFeaturizer:
    """Runs the Whisper encoder over 30 s segments and windows the stacked states per video frame."""

    encoder: Any  # transformers WhisperEncoder
    extractor: Any  # transformers WhisperFeatureExtractor
    pre_norm_last: bool = False  # True for MuseTalk v1.0 (see last_state_pre_norm)

    @property
    def n_states(self) -> int:
        """States stacked per step (embedding + each layer)."""
        return int(self.encoder.config.encoder_layers) + 1

    @property
    def dim(self) -> int:
        """Encoder width (d_model)."""
        return int(self.encoder.config.d_model)

    @property
    def feature_dim(self) -> int:
        """Values per video frame: 10 steps x states x d_model."""
        return WINDOW_STEPS * self.n_states * self.dim

    def encode_segment(self, pcm: np.ndarray) -> np.ndarray:
        """Stacked hidden states [1500, S, D] of one segment of at most 30 s (padded as upstream does)."""
        if len(pcm) > SEGMENT_SAMPLES:
            raise ValueError(f"a segment holds at most {SEGMENT_SAMPLES} samples, got {len(pcm)}")
        mel = self.extractor(pcm, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features
        param = next(self.encoder.parameters())
        with torch.inference_mode():
            x = torch.from_numpy(mel).to(device=param.device, dtype=param.dtype)
            stacked = stacked_states(self.encoder, x, self.pre_norm_last)[0]  # [1500, S, D]
        return stacked.float().cpu().numpy()

    def states(self, pcm: np.ndarray) -> np.ndarray:
        """Stacked states [floor(n/320), S, D] of a whole utterance."""
        total = encoder_steps(len(pcm))
        parts = [
            self.encode_segment(pcm[i : i + SEGMENT_SAMPLES]) for i in range(0, len(pcm), SEGMENT_SAMPLES)
        ]
        if not parts:
            return np.zeros((0, self.n_states, self.dim), dtype=np.float32)
        return np.concatenate(parts, axis=0)[:total]

    def features(self, pcm: np.ndarray) -> np.ndarray:
        """Per-frame features [frame_count(n), feature_dim] for a whole utterance."""
        pcm = np.ascontiguousarray(pcm, dtype=np.float32).reshape(-1)
        states = self.states(pcm)
        return frame_windows(states, 0, frame_count(len(pcm)), total_steps=len(states))

    def stream(self) -> WhisperFeatureStream:
        """A fresh incremental extractor for one live utterance."""
        return WhisperFeatureStream(self)


@dataclass
class WhisperFeatureStream:
    """Features for a growing 16 kHz buffer; re-encodes at most the current (<= 30 s) segment per push.

    Frame f is emitted once audio reaches the end of frame f+2 (its window's last step). Whisper attends
    over the whole segment, so a frame emitted early saw zeros where later audio now is: live features
    differ slightly from whole-file ones (the price of streaming; finish() then matches the file exactly
    for frames not yet emitted).
    """

    featurizer: WhisperFeaturizer
    _pending: list[np.ndarray] = field(default_factory=list)
    _segment: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float32))
    _segment_start: int = 0  # sample index where the current segment starts
    _done: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (first step, states) of full segments
    _total: int = 0  # samples pushed
    _emitted: int = 0  # frames returned so far
    encodes: int = 0  # encoder runs so far (for tests and benchmarks)

    def push(self, pcm: np.ndarray) -> np.ndarray:
        """Add 16 kHz float32 PCM; return features [k, D] for frames that became final."""
        pcm = np.ascontiguousarray(pcm, dtype=np.float32).reshape(-1)
        self._total += len(pcm)
        self._segment = np.concatenate([self._segment, pcm]) if len(self._segment) else pcm.copy()
        while len(self._segment) >= SEGMENT_SAMPLES:  # a full segment never changes again: encode it once
            self._done.append(
                (encoder_steps(self._segment_start), self._encode(self._segment[:SEGMENT_SAMPLES]))
            )
            self._segment = self._segment[SEGMENT_SAMPLES:]
            self._segment_start += SEGMENT_SAMPLES
        ready = max(0, frame_count(self._total) - LOOKAHEAD_FRAMES)
        return self._emit(ready, total_steps=encoder_steps(self._total))

    def finish(self) -> np.ndarray:
        """End of utterance: return the features of every remaining frame (zeros past the end)."""
        return self._emit(frame_count(self._total), total_steps=encoder_steps(self._total))

    def _encode(self, pcm: np.ndarray) -> np.ndarray:
        self.encodes += 1
        return self.featurizer.encode_segment(pcm)

    def _emit(self, upto: int, total_steps: int) -> np.ndarray:
        first = self._emitted
        if upto <= first:
            return np.zeros((0, self.featurizer.feature_dim), dtype=np.float32)
        last_step = STEPS_PER_FRAME * (upto - 1) + WINDOW_START + WINDOW_STEPS  # exclusive
        seg_step = encoder_steps(self._segment_start)
        parts = [states for _, states in self._done]
        offset = self._done[0][0] if self._done else seg_step
        if last_step > seg_step and len(self._segment):
            parts.append(self._encode(self._segment))  # recompute the current partial segment only
        states = (
            np.concatenate(parts) if parts else np.zeros((0, self.featurizer.n_states, self.featurizer.dim))
        )
        out = frame_windows(states, first, upto - first, total_steps=total_steps, states_offset=offset)
        self._emitted = upto
        first_needed = STEPS_PER_FRAME * upto + WINDOW_START
        # full segments no future window reaches are dropped, so memory stays bounded
        self._done = [(start, st) for start, st in self._done if start + len(st) > first_needed]
        return out

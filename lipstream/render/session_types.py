"""What a live session is configured with, what it says besides frames, and the figures it keeps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from pydantic import BaseModel, Field

from lipstream.avatar.phrase_blinks import PhraseBlinkConfig
from lipstream.render.accel import AccelConfig


class SessionConfig(BaseModel):
    """Options of one live session."""

    encode: bool = True  # emit H.264 access units (else raw RGB images)
    # scale the stream down to the largest allowed size not wider than this (base_frames.stream_sizes);
    # None = the avatar's own size
    output_width: int | None = None
    bitrate: int = 2_500_000
    voice: str = "piper"
    max_lead_seconds: float = Field(1.0, gt=0)  # how far production may run ahead of playback during speech
    idle_lead_seconds: float = Field(0.12, ge=0)  # ... and while idle (small: a new utterance starts soon)
    interrupt_margin_frames: int = Field(2, ge=1)  # the stream resumes this far ahead of playback
    max_utterance_seconds: float = 600.0
    # unproduced speech a session may hold across utterances: pushed PCM over it is refused, TTS waits
    max_pending_seconds: float = Field(180.0, gt=0)
    tts_lookahead_seconds: float = Field(15.0, gt=0)  # TTS runs at most this far ahead of playback
    queue_frames: int = Field(8, ge=1)  # produced frames waiting for the consumer
    accel: AccelConfig = Field(default_factory=AccelConfig)
    # "full": composite and encode whole frames (what recorders and `lipstream client --out` need);
    # "patch": encode only the crop-space mouth rectangle, the client composites it (docs/protocol.md)
    stream: Literal["full", "patch"] = "full"
    # cap of the patch stream (a 240×96 crop-space picture at 25 fps): 150 kbit/s codes the mouth at ~39 dB,
    # 1.5 dB under 300 and alike to the eye at the size the page shows it (docs/benchmarks-history.md)
    patch_bitrate: int = Field(150_000, gt=0)
    # blink a little more often at phrase ends, on avatars whose idle loop's blinks are drawn
    phrase_blinks: PhraseBlinkConfig = Field(default_factory=PhraseBlinkConfig)


@dataclass
class SessionEvent:
    """An event on the frame stream."""

    type: Literal["speech_started", "playback_finished", "text", "error"]
    utterance_id: int | None = None
    position_samples: int = 0
    interrupted: bool = False
    message: str = ""  # the error's message, or a `text` event's text (what is said from position_samples on)


@dataclass
class SessionStats:
    """Running figures of a session (also what the server's admin endpoint shows)."""

    frames: int = 0
    speech_frames: int = 0
    idle_frames: int = 0
    utterances: int = 0
    interrupts: int = 0
    underruns: int = 0  # frames where speech input was late, filled with an idle frame
    late_frames: int = 0  # frames produced after their due time on the playback clock
    max_late_ms: float = 0.0
    ttff_ms: list[float] = field(default_factory=list)  # first push -> first speech frame, per utterance
    stage_ms: dict[str, float] = field(default_factory=dict)
    neural_frames: int = 0
    accel: dict[str, int] = field(default_factory=dict)  # keyframes, codebook_hits, infill_frames, ...

    def as_dict(self) -> dict:
        """JSON-friendly view."""
        return {
            "frames": self.frames,
            "speech_frames": self.speech_frames,
            "idle_frames": self.idle_frames,
            "utterances": self.utterances,
            "interrupts": self.interrupts,
            "underruns": self.underruns,
            "late_frames": self.late_frames,
            "max_late_ms": round(self.max_late_ms, 1),
            "ttff_ms": [round(v, 1) for v in self.ttff_ms],
            "stage_ms": self.stage_ms,
            "neural_frames": self.neural_frames,
            **{k: v for k, v in self.accel.items() if k not in ("frames", "neural_frames")},
        }

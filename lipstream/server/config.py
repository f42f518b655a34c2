"""Server configuration and the limits every session is held to (documented in docs/protocol.md)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, Field, model_validator

from lipstream.media.opus import OpusSettings

MIB = 1024 * 1024


class Limits(BaseModel):
    """Per-message and per-server limits."""

    max_message_bytes: int = Field(default=8 * MIB, ge=1024)
    max_upload_bytes: int = Field(default=8 * MIB, ge=1024)
    max_upload_seconds: float = Field(default=120.0, gt=0)
    max_text_chars: int = Field(default=4000, ge=1)
    max_sessions: int = Field(default=8, ge=1)
    max_queued_speaks: int = Field(default=4, ge=1)  # speak requests waiting in one session
    max_pending_seconds: float = Field(default=180.0, gt=0)  # unplayed speech one session may hold
    hello_timeout_seconds: float = Field(default=10.0, gt=0)
    send_timeout_seconds: float = Field(default=20.0, gt=0)  # a client reading nothing this long is dropped
    header_timeout_seconds: float = Field(default=10.0, gt=0)  # to send a whole HTTP request head
    max_connections: int = Field(default=64, ge=2)  # open TCP connections (sessions, page loads, idle ones)

    @model_validator(mode="after")
    def _upload_fits(self) -> Limits:
        if self.max_pending_seconds < self.max_upload_seconds:
            raise ValueError("max_pending_seconds must be at least max_upload_seconds (uploads queue whole)")
        return self

    @property
    def transport_max_bytes(self) -> int:
        """Hard cap handed to the WebSocket transport: over it the connection closes with 1009."""
        return 2 * max(self.max_message_bytes, self.max_upload_bytes) + 64


class ServerConfig(BaseModel):
    """What `lipstream serve` was asked for."""

    host: str = "127.0.0.1"
    port: int = 8000
    engine: str = "viseme"
    token: str | None = None
    avatars_dir: Path | None = None
    voice: str = "piper"
    max_lead_seconds: float = 1.0
    limits: Limits = Field(default_factory=Limits)
    stream_modes: tuple[str, ...] = ("full", "patch")  # what hello.stream may ask for (docs/protocol.md)
    patch_bitrate: int = Field(150_000, gt=0)  # the mouth-patch stream's cap (SessionConfig.patch_bitrate)
    replica_id: str | None = None  # set on a Ray Serve replica; named in `ready` and /healthz
    opus: OpusSettings = Field(default_factory=OpusSettings)  # sessions that ask for Opus audio (1.3)
    # the neural engine's passes pooled across sessions (lipstream.engines.batcher); the viseme engine is
    # per-frame cheap and never batched
    batching: bool = True
    batch_sizes: tuple[int, ...] = (4, 8, 16, 32)
    max_batch_wait_ms: float = Field(40.0, ge=0, le=1000)

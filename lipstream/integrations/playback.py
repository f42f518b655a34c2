"""What every framework adapter does the same way: open a prepared avatar and its engine, configure a
raw-frame Session, and turn the framework's interleaved int16 audio into the mono PCM a Session takes.

Imports no framework, so the Pipecat processor and the LiveKit generator share it.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from lipstream.avatar.bundle import AvatarBundle, load_avatar
from lipstream.engines.base import Engine
from lipstream.render.session_types import SessionConfig

AvatarSource = str | os.PathLike | AvatarBundle
EngineSource = str | Engine


def load_avatar_and_engine(avatar: AvatarSource, engine: EngineSource) -> tuple[AvatarBundle, Engine]:
    """The bundle (a name under $LIPSTREAM_HOME, a folder, or a bundle) and the engine (a name or an
    instance); blocking (reads the bundle), so adapters run it off their event loop."""
    from lipstream.engines.registry import create_engine

    bundle = avatar if isinstance(avatar, AvatarBundle) else load_avatar(avatar)
    return bundle, create_engine(engine) if isinstance(engine, str) else engine


def raw_frames_config(config: SessionConfig | None, output_width: int | None) -> SessionConfig:
    """`config` (default SessionConfig()) set to emit raw RGB pictures, scaled to `output_width` if given:
    frameworks take pictures, not H.264."""
    update: dict[str, Any] = {"encode": False}
    if output_width is not None:
        update["output_width"] = output_width
    return (config or SessionConfig()).model_copy(update=update)


def mono_int16(data: bytes | memoryview | np.ndarray, channels: int) -> np.ndarray:
    """Interleaved int16 PCM with `channels` channels as one mono int16 channel (channels averaged)."""
    pcm = np.frombuffer(data, dtype=np.int16) if not isinstance(data, np.ndarray) else data.reshape(-1)
    if channels > 1:
        pcm = pcm.reshape(-1, channels).mean(axis=1).astype(np.int16)
    return pcm

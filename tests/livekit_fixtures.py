"""Inputs of the LiveKit tests: a small prepared avatar and espeak-ng speech at 24 kHz.

The avatar is the suite's own `small_avatar`, prepared in this process (face tracking must be available
here), unless LIPSTREAM_LIVEKIT_AVATAR names a prepared bundle folder with its viseme caches, e.g. one made
by another environment with `python tests/pipecat/make_avatar.py DIR` (docs/integrations.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest

RATE = 24_000  # what LiveKit agents send avatars by default (AvatarSession's sample_rate)
FRAME_SAMPLES = RATE // 25  # one 40 ms video frame of audio
TEXT = "Good evening. Here is the news, read by a face that was never filmed saying it."


def prepared_avatar(request: pytest.FixtureRequest) -> Path:
    """The suite's small avatar (conftest's `small_avatar`: 2 s, 360×640; the Session builds its viseme
    caches at start), or the prepared bundle folder LIPSTREAM_LIVEKIT_AVATAR names."""
    given = os.environ.get("LIPSTREAM_LIVEKIT_AVATAR")
    if given:
        return Path(given)
    return Path(request.getfixturevalue("small_avatar").path)


def speech_24k(tmp_path_factory: pytest.TempPathFactory, text: str = TEXT) -> np.ndarray:
    """`text` spoken by espeak-ng, resampled to 24 kHz int16 mono."""
    from lipstream.audio.decode import resample, to_int16

    if shutil.which("espeak-ng") is None:
        pytest.skip("espeak-ng is not installed (make setup installs it)")
    path = tmp_path_factory.mktemp("speech") / "news.wav"
    subprocess.run(["espeak-ng", "-w", str(path), text], check=True, timeout=60)
    with wave.open(str(path)) as wav:
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16)
        return to_int16(resample(pcm, wav.getframerate(), RATE))

"""Audio out: float PCM as a 16-bit WAV file (the HTTP voice, and test fixtures)."""

from __future__ import annotations

import io
import wave

import numpy as np

from lipstream.audio.timeline import SAMPLE_RATE


def wav_bytes(pcm: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    """Mono float PCM in [-1, 1] as a 16-bit WAV file."""
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes((np.clip(pcm, -1.0, 1.0) * 32767.0).astype("<i2").tobytes())
    return out.getvalue()

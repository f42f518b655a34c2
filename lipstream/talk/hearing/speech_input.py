"""Turn a user's --audio file or --text into one Speech utterance."""

from __future__ import annotations

from pathlib import Path

from lipstream.audio.speech import Speech
from lipstream.errors import LipstreamError


def load_speech(audio: str | Path | None = None, text: str | None = None, voice: str = "piper") -> Speech:
    """Decode an audio/video file, or synthesise `text` with the offline TTS `voice`."""
    if (audio is None) == (text is None):
        raise LipstreamError("give exactly one of --audio FILE or --text TEXT")
    if audio is not None:
        from lipstream.audio.decode import load_audio

        return Speech(pcm=load_audio(audio), source=str(audio))
    from lipstream.talk.voices.tts import create_tts

    return create_tts(voice).synthesize(text or "")

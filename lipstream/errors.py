"""User-facing errors: one line that says what was wrong and what to do."""

from __future__ import annotations


class LipstreamError(Exception):
    """An error caused by the user's input or setup; the CLI prints it as one line and exits 2."""

    exit_code = 2


class MediaError(LipstreamError):
    """Unreadable or unsuitable audio/video input."""


class FaceNotFoundError(LipstreamError):
    """No usable face in the avatar source."""


class AvatarError(LipstreamError):
    """Unknown, existing or malformed avatar bundle."""


class ModelError(LipstreamError):
    """Missing, truncated or mismatched model weights, or an unavailable device."""


class SpeechError(LipstreamError):
    """Text with nothing to say, or a TTS voice that cannot run."""


class QueueFullError(LipstreamError):
    """A session already holds as much pending speech as it may; the input was refused, nothing else."""

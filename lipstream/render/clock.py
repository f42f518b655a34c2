"""The playback clock: where the client's player is, from its own reports or else from wall time."""

from __future__ import annotations

from lipstream.audio.timeline import FPS, SAMPLE_RATE, SAMPLES_PER_FRAME

CLOCK_SLACK_SECONDS = 0.5


class PlaybackClock:
    """Where playback is now, in frames: the client's report when there is one, else wall time."""

    def __init__(self) -> None:
        self._origin: float | None = None  # wall time of tick 0
        self._report: tuple[int, float] | None = None  # (pts samples, wall time received)

    def start(self, now: float) -> None:
        """Tick 0 is being shown at `now` (set at the first frame)."""
        if self._origin is None:
            self._origin = now

    def report(self, pts_samples: int, now: float) -> None:
        """The client says it is playing `pts_samples` now."""
        self._report = (int(pts_samples), now)

    def max_position(self, now: float) -> int:
        """The furthest pts a real player can have reached by `now`: real time since the first frame,
        plus 0.5 s and 0.1 % for a sound card clock running fast."""
        if self._origin is None:
            return 0
        elapsed = max(0.0, now - self._origin)
        return int((elapsed * 1.001 + CLOCK_SLACK_SECONDS) * SAMPLE_RATE)

    def position_frames(self, now: float) -> float:
        """Estimated frame being played at `now` (fractional)."""
        if self._report is not None:
            pts, at = self._report
            return pts / SAMPLES_PER_FRAME + (now - at) * FPS
        if self._origin is None:
            return 0.0
        return (now - self._origin) * FPS

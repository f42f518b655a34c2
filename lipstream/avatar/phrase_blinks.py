"""Blinks at phrase ends: people blink a little more often as a phrase ends than in its middle.

The idle loop's blinks are drawn at prepare time and play wherever the loop is; these are decided while the
avatar speaks. A phrase ends where voiced frames give way to a pause that lasts; then, by a hash of the frame
(the same decision in Python and on the page, with no shared random state), a blink starts unless another
is near, the loop's own drawn blinks included. Only avatars whose loop blinks are drawn get them: footage
that blinks by itself keeps its own rhythm.

`lipstream/web/edge/lids.js` is the page's copy of this machine (tests/test_lids_js_parity.py keeps the two
in step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from lipstream.avatar.blink import BlinkConfig, blink_curve
from lipstream.avatar.bundle import Manifest

HASH_MULTIPLIER = 2654435761  # Knuth's multiplicative hash: frame numbers spread evenly over [0, 2^32)


@dataclass(frozen=True)
class PhraseBlinkConfig:
    """When a phrase end brings a blink."""

    enabled: bool = True
    # of a phrase end bringing a blink: with the loop's own ~10 a minute (and the gap kept from them) about
    # 4 in 10 phrase ends of ordinary speech blink, ~16 blinks a minute in all, as people's while speaking
    chance: float = 0.7
    min_phrase_s: float = 0.8  # voiced time before a pause for it to end a phrase (not a stop consonant)
    pause_s: float = 0.2  # silence that confirms a phrase end; the blink starts then
    gap_s: float = 1.2  # no phrase blink this near another blink (drawn or phrase), before or after
    duration_s: float = 0.32  # one blink: lid down, shut 3 frames, up (8 frames at 25 fps; issue 37: 0.28 s
    # read under 0.55 of the eyes' openness for 4 frames, 160 ms, to a face mesh over the output)

    def entry(self) -> dict:
        """What the web export's manifest carries for the page's copy of the machine."""
        return {
            "chance": self.chance, "min_phrase_s": self.min_phrase_s, "pause_s": self.pause_s,
            "gap_s": self.gap_s, "duration_s": self.duration_s,
        }  # fmt: skip


def phrase_chance(frame: int) -> float:
    """A uniform 0..1 drawn from the frame number alone."""
    return ((int(frame) * HASH_MULTIPLIER) % (1 << 32)) / float(1 << 32)


@dataclass
class PhraseEndBlinks:
    """Per output frame, in order: is it voiced, where is the loop; returns the lid closure to draw (0..1)."""

    loop_length: int
    drawn_starts: list[int]  # loop positions where the loop's drawn blinks begin
    fps: int = 25
    config: PhraseBlinkConfig = field(default_factory=PhraseBlinkConfig)
    lid: BlinkConfig = field(default_factory=BlinkConfig)

    @classmethod
    def for_manifest(
        cls, manifest: Manifest, loop_length: int, config: PhraseBlinkConfig | None = None
    ) -> PhraseEndBlinks | None:
        """The machine for an avatar whose idle loop's blinks are drawn; None for the others or when off."""
        starts = manifest.drawn_blink_starts()
        config = config or PhraseBlinkConfig()
        if starts is None or not config.enabled:
            return None
        return cls(loop_length, starts, manifest.fps, config)

    def __post_init__(self) -> None:
        self.curve = blink_curve(self.config.duration_s * self.fps, self.lid)
        self._voiced_run = 0
        self._pause_run = 0
        self._started: int | None = None  # frame the current or last phrase blink began
        self._last: int | None = None  # the last frame stepped

    @property
    def started(self) -> int | None:
        """The frame the latest phrase blink began on (None: none yet)."""
        return self._started

    def step(self, frame: int, voiced: bool, position: int) -> float:
        """Lid closure for output frame `frame` (its number decides by hash), shown on loop `position`."""
        if self._last is not None and frame != self._last + 1:
            self._voiced_run = self._pause_run = 0  # a jump (an interrupt moved the timeline): start afresh
            if self._started is not None and frame < self._started:
                self._started = None
        self._last = frame
        if voiced:
            self._voiced_run += 1
            self._pause_run = 0
        else:
            self._pause_run += 1
            pause = max(1, int(round(self.config.pause_s * self.fps)))
            if self._pause_run == pause:
                phrase = self._voiced_run >= self.config.min_phrase_s * self.fps
                if phrase and self._may_start(frame, position):
                    self._started = frame
                self._voiced_run = 0
        if self._started is None:
            return 0.0
        k = frame - self._started
        return float(self.curve[k]) if 0 <= k < len(self.curve) else 0.0

    def _may_start(self, frame: int, position: int) -> bool:
        if not self.config.enabled or phrase_chance(frame) >= self.config.chance:
            return False
        gap = self.config.gap_s * self.fps
        if self._started is not None and frame - self._started < gap:
            return False
        for start in self.drawn_starts:
            ahead = (start - position) % self.loop_length  # the drawn blink comes this many frames later
            behind = (position - start) % self.loop_length  # ... or began this many frames ago
            if min(ahead, behind) < gap:
                return False
        return True

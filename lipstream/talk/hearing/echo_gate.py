"""The echo gate: a speech start the microphone may owe to the avatar's own voice is held, not obeyed.

Until the echo canceller has locked on to the avatar's echo, the VAD may hear the avatar itself. A start
made then is held; it is released when the speech goes on after the lock (or is clearly louder than the
echo the filter expects: the user talking over the avatar; or goes on for 0.8 s with no echo of the avatar
found in it: a microphone that does not hear the avatar), and dropped when it ends first. A released start
is placed where the voice heard at its release began: after a silence that followed the held start (the echo
cancelled once the filter learnt it), not at the held start, which was the echo; a start placed there would
look like the user going on with the question just answered.
"""

from __future__ import annotations

import logging

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.talk.hearing.echo import EchoCanceller
from lipstream.talk.hearing.vad import VadEvent, VoiceActivityDetector

log = logging.getLogger(__name__)

# the canceller finds a real echo's delay within 0.3-0.5 s of the avatar speaking (benchmarks/echo_bench.py);
# nothing found after this long (with room for a loaded machine) means the microphone does not hear it
NO_ECHO_AFTER_MS = 3000.0
# a silence this long ends a run of voice: a released start is placed at the run heard at its release
RUN_BREAK_MS = 150.0
# an echo has its delay found 0.24-0.63 s after it reaches the microphone (Piper and espeak-ng speech, 40-250
# ms delays, ×0.1-0.3, direct or through a room; issue 47), and a start is held 200 ms (the VAD's start) into
# that voice: a held voice the delay search has read this long beside the avatar's audio (voiced chunks only,
# so >= 1 s after its onset), finding none of it, is the user's, not the echo (a headset, the browser's own
# echo cancellation, a client sending a recording). Waiting for NO_ECHO_AFTER_MS instead dropped every
# question over before the avatar's first 3 s ended: no Talk session's greeting could be talked over.
VOICE_WITHOUT_ECHO_MS = 800.0
# ... and held voice with no echo confirmed (no delay found, or a delay the filter has not cancelled) for this
# long in all is the user's: a real echo's delay is locked within 0.54 s of the avatar speaking (echo bench),
# its start held 0.2 s into it, and its filter removes 10 dB well within 0.5 s of the lock (< ~0.85 s in
# all). A delay the filter cannot cancel is no echo: the user's question in the avatar's own voice (Piper
# over a Piper greeting) made the delay search accept one (-91 ms, confidence 9.97) the filter never adapted
# to (ERLE 0 to -16 dB), and a short question late in the greeting, its player stalling, had 0.6 s with no
# delay then 0.52 s of an uncancelled one: both were dropped
NO_ECHO_CONFIRMED_MS = 1000.0


class EchoGate:
    """Holds back VAD speech starts while the avatar's echo may still be in the microphone (worker thread)."""

    def __init__(
        self, echo: EchoCanceller | None, vad: VoiceActivityDetector, start_ms: float, end_silence_ms: float
    ) -> None:
        """`echo`: the canceller (None: no gate, events pass); `vad`: the detector whose events are gated;
        `start_ms`/`end_silence_ms`: its speech-start and end-of-speech durations."""
        self.echo = echo
        self.vad = vad
        self.start_ms = start_ms
        self.end_silence_ms = end_silence_ms
        self._held_start: VadEvent | None = None  # a speech start waiting for the canceller to lock on
        self._held_double_talk = 0  # samples of the user louder than the echo since the held start
        self._held_unmatched = 0  # samples of held voice, the avatar audible, searched with no echo found
        self._held_unadapted = 0  # ... with a delay found that the filter has not (yet) cancelled
        self._voice_from: int | None = None  # while a start is held: where the voice heard now began
        self._quiet = 0  # samples of silence since the VAD last heard a voice
        self._voiced_locked = 0  # samples of that voice heard since the canceller locked on
        self._samples = 0  # microphone samples gated so far
        self._echo_locked = False
        self._lock_resyncs = 0  # the canceller's resync count the lock was made under

    def _echo_unlocked(self) -> bool:
        """Worker: the avatar is audible and the canceller has not yet locked on to its echo (no delay
        found, or its filter has not yet stayed at 10 dB for the conversation's end silence and a little
        more). A start held before the lock was decided on the raw echo; after the lock it is released by
        a fresh start's length of voice in the cleaned audio (`_voice_after_lock`: the VAD, which ends
        speech only after the detector's longer cap, may still be in the speech the echo opened). Once
        locked it stays trusted (during double talk its ERLE drops by definition, and that must not block
        a barge-in) until playback jumps (the canceller resynchronises: an interrupt, a stall).
        When the avatar has been audible for 3 s and no delay was found, this microphone does not hear it
        (headphones, the browser's own echo cancellation): nothing to wait for."""
        if self.echo is None:
            return False
        stats = self.echo.stats
        settle_ms = self.end_silence_ms + 200
        if stats.resyncs != self._lock_resyncs:  # playback jumped (an interrupt, a stall): check again
            self._lock_resyncs = stats.resyncs
            self._echo_locked = False
        if stats.delay_ms is None:
            self._echo_locked = False
            if getattr(stats, "search_ms", 0.0) >= NO_ECHO_AFTER_MS:
                return False
        elif stats.converged and getattr(stats, "converged_ms", float("inf")) >= settle_ms:
            self._echo_locked = True
        return stats.reference_active and not self._echo_locked

    def gate(self, events: list[VadEvent], samples: int) -> list[VadEvent]:
        """Worker: hold back a speech start while the avatar's echo may still be in the microphone (the
        canceller has not locked on yet); release it once the echo is under control and the speech goes
        on, drop it when that speech ends first (it was the avatar hearing itself)."""
        likely = self._echo_unlocked()
        chunk_start = self._samples  # the stream sample this chunk starts at
        self._samples += samples
        out: list[VadEvent] = []
        for event in events:
            if self._held_start is not None:
                if event.kind == "speech_end":
                    log.info("held speech start dropped: it ended while the echo was uncertain")
                    self._held_start = None
                continue  # pause/resume/end of a held start belong to it
            if event.kind == "speech_start" and likely:
                log.info("speech start at %d held: echo not locked yet (%s)", event.sample, self.echo.stats)
                self._held_start = event
                self._held_double_talk = self._held_unmatched = self._held_unadapted = 0
                self._voice_from, self._quiet, self._voiced_locked = event.sample, 0, 0
                continue
            out.append(event)
        if self._held_start is None:
            return out
        self._track_voice(chunk_start, samples, locked=not likely)
        if self.echo.stats.louder_than_echo and self.vad.speaking:
            self._held_double_talk += samples
        self._count_unmatched(samples)
        # released only while a voice is heard now: `in_speech` also holds through the pause that may end
        # a speech made by the echo alone
        if self.vad.speaking and (self._voice_after_lock() or self._user_over_echo()):
            out.append(self._release())
        elif self.vad.speaking and self._voice_without_echo():
            # no echo in any of the voice since the held start: that start was the user's own
            out.append(self._release(at_held=True))
        return out

    def _count_unmatched(self, samples: int) -> None:
        """Worker: count the held voice heard while the avatar was audible and no echo delay was found.
        A resync (the player stalled for late frames) restarts the delay search but not this count, as it
        does not restart `search_ms`: on a loaded server the player stalled every 0.2-0.5 s, each stall
        emptied the search, and a question over the greeting was dropped as echo (issue 47)."""
        stats = self.echo.stats
        if not (self.vad.speaking and stats.reference_active):
            return
        if stats.delay_ms is None:
            self._held_unmatched += samples
        elif not stats.adapted:
            self._held_unadapted += samples

    def _voice_without_echo(self) -> bool:
        """Worker: the held voice has been compared with the avatar's audio for VOICE_WITHOUT_ECHO_MS with
        no delay found, or for NO_ECHO_CONFIRMED_MS with none found or one the filter could not cancel: the
        user is talking over an avatar this microphone does not hear."""
        unconfirmed = self._held_unmatched + self._held_unadapted
        return (
            self._held_unmatched >= VOICE_WITHOUT_ECHO_MS * SAMPLE_RATE / 1000
            or unconfirmed >= NO_ECHO_CONFIRMED_MS * SAMPLE_RATE / 1000
        )

    def _track_voice(self, chunk_start: int, samples: int, locked: bool) -> None:
        """Worker: where the voice heard now began, a run of voiced chunks broken only by RUN_BREAK_MS of
        silence (the gaps between one speaker's words are shorter; the canceller taking the echo away
        leaves a longer one before a user who speaks up later), and how much of it came after the lock."""
        if not locked:
            self._voiced_locked = 0
        if self.vad.speaking:
            self._quiet = 0
            if self._voice_from is None:
                self._voice_from = chunk_start
            if locked:
                self._voiced_locked += samples
            return
        self._quiet += samples
        if self._quiet >= RUN_BREAK_MS * SAMPLE_RATE / 1000:
            self._voice_from, self._voiced_locked = None, 0

    def _voice_after_lock(self) -> bool:
        """Worker: the canceller has locked on and the run of voice heard now has gone on in the cleaned
        audio for as long as the VAD needs to start speech: a fresh start, not a syllable of residual echo
        heard by a VAD still in the speech the held start opened (that released a barge-in 0.3 s before
        the user spoke, in 3 runs of 4 on a Xeon)."""
        return self._voiced_locked >= self.start_ms * SAMPLE_RATE / 1000

    def _release(self, at_held: bool = False) -> VadEvent:
        """Worker: the held start, placed where the voice heard now began (later than the held start when
        a silence came between: the held start was the echo, cancelled since), or where it was (`at_held`)."""
        held = self._held_start
        assert held is not None and self.echo is not None
        self._held_start = None
        at = held.sample
        if not at_held and self._voice_from is not None:
            at = max(at, self._voice_from)
        stats = self.echo.stats
        log.info("held speech start at %d released at %d: the user's voice (%s)", held.sample, at, stats)
        return VadEvent("speech_start", at)

    def _user_over_echo(self) -> bool:
        """Worker: before the lock, the filter has learnt the room and has heard, for the length of a
        speech start, more left over than the echo it expects (the filter stops learning during double
        talk, so waiting for the lock could wait for ever), while the VAD, which no longer hears the echo
        the filter explains, hears speech: the user is talking over the avatar."""
        needed = self.start_ms * SAMPLE_RATE / 1000
        return bool(self.echo.stats.adapted) and self._held_double_talk >= needed

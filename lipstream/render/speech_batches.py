"""How many speech frames the session makes at a time: few at an utterance's start, the engine's batch once
frames are well ahead of playback (a batch goes out only when all of it is made)."""

from __future__ import annotations

# an utterance's first frame goes out alone: made with the next one, a whole-frame stream's first speech IDR
# (~50-65 ms of x264 at 1080x1920 on a busy 2-core EPYC) waited for a second encode, and arrived after its
# due time behind the idle lead often enough to cost the player a re-anchor (its 150 ms jitter buffer)
FIRST_BATCH_FRAMES = 1


def speech_batch(engine_batch: int | float, ahead_frames: float, started: bool) -> int:
    """Frames to make in the next speech batch: the utterance's first frame alone (it reaches the client
    soon), then the engine's batch, but no more than half the frames already sent ahead of playback. Just
    after a first frame (sent ~3 frames ahead) a whole batch of 8 made the second frame late, and the player
    restarted its audio a jitter later (whole frames on 2 cores, every speak); the lead grows as frames go
    out faster than they play."""
    if not started:
        return FIRST_BATCH_FRAMES
    return max(1, min(int(engine_batch), int(ahead_frames // 2)))

"""How many speech frames the session makes at a time: at an utterance's start no more than the frames sent
ahead of playback allow (a batch goes out only when all of it is made), then the engine's batch."""

from __future__ import annotations

# an utterance's first frame goes out alone: made with the next one, a whole-frame stream's first speech IDR
# (~50-65 ms of x264 at 1080x1920 on a busy 2-core EPYC) waited for a second encode, and arrived after its
# due time behind the idle lead often enough to cost the player a re-anchor (its 150 ms jitter buffer)
FIRST_BATCH_FRAMES = 1
RAMP_BATCHES = 2  # engine batches at an utterance's start made no larger than half the lead


def speech_batch(engine_batch: int | float, ahead_frames: float, emitted: int) -> int:
    """Frames to make in the next speech batch of an utterance that has `emitted` frames out: its first
    frame alone (it reaches the client soon), then, for its first two engine batches, no more than half the
    frames already sent ahead of playback, then the engine's batch. Just after a first frame (sent ~3 frames
    ahead) a whole batch of 8 made the second frame late, and the player restarted its audio a jitter later
    (whole frames on 2 cores, every speak); the lead grows as frames go out faster than they play. Only at
    the start: an engine slower than real time later on keeps its whole batches (smaller ones would cost it
    throughput just when it is behind)."""
    batch = max(1, int(engine_batch))
    if emitted == 0:
        return FIRST_BATCH_FRAMES
    if emitted < RAMP_BATCHES * batch:
        return max(1, min(batch, int(ahead_frames // 2)))
    return batch

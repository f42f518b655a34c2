"""Offline render: one utterance -> an MP4 (H.264 + AAC) and a JSON report."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from pydantic import BaseModel, Field

from lipstream.audio.decode import to_int16
from lipstream.audio.levels import SilenceDetector
from lipstream.audio.timeline import FPS, SAMPLES_PER_FRAME
from lipstream.avatar.bundle import AvatarBundle
from lipstream.avatar.phrase_blinks import PhraseBlinkConfig, PhraseEndBlinks
from lipstream.engines.base import Engine, Speech
from lipstream.errors import MediaError
from lipstream.media.mp4 import Mp4Writer
from lipstream.render.accel import (
    AccelConfig,
    PatchScheduler,
    UtteranceFrames,
    load_codebook,
    resolve_accel,
    save_codebook,
    utterance_frames,
)
from lipstream.render.compositor import Compositor
from lipstream.render.timing import StageTimer

log = logging.getLogger(__name__)

MAX_AUDIO_SECONDS = 600.0  # one render is at most 10 minutes of speech; longer input is refused up front


@dataclass(frozen=True)
class H264Settings:
    """libx264 settings of the render's MP4; threads=0 lets libx264 choose."""

    preset: str
    crf: int
    tune: str | None = None
    threads: int = 0


# `--quality` levels, measured in docs/benchmarks-history.md (issue 11, encode_bench.py). H.264 at
# 1080×1920 is most of a render's cost: the setting before issue 11 (veryfast crf 20) held a render to
# ~1.25x real time on a 2-core review machine. ultrafast needs ~40 % of its encoder CPU, and at these
# CRFs its mouth PSNR is higher (veryfast's mb-tree starves the moving mouth of bits); the price is
# bigger files. "best" spends about twice the encoder time of "balanced" for a sharper, smaller file.
QUALITY_LEVELS: dict[str, H264Settings] = {
    "fast": H264Settings("ultrafast", 23),
    "balanced": H264Settings("ultrafast", 20),
    "best": H264Settings("superfast", 18),
}
DEFAULT_QUALITY = "balanced"


def encoder_settings(quality: str) -> H264Settings:
    """The H.264 settings of a `--quality` level; MediaError names the levels for an unknown one."""
    try:
        return QUALITY_LEVELS[quality]
    except KeyError:
        levels = ", ".join(QUALITY_LEVELS)
        raise MediaError(f"unknown render quality {quality!r}; choose one of {levels}") from None


class RenderReport(BaseModel):
    """What REPORT.json holds."""

    engine: str
    avatar: str
    output: str
    frames: int
    fps: int = FPS
    width: int
    height: int
    audio_seconds: float
    wall_seconds: float
    realtime_factor: float
    silent_frames: int
    accel: bool = True
    keyframes: int = 0  # frames whose patch came from the codebook or the engine
    codebook_hits: int = 0
    neural_frames: int = 0  # engine passes
    infill_frames: int = 0  # cross-faded between keyframes
    ttff_ms: float = 0.0  # start of the render to the first composited frame
    phrase_blinks: list[int] = Field(default_factory=list)  # frames where a blink at a phrase end starts
    quality: str = DEFAULT_QUALITY  # the `--quality` level ("custom" when settings were given directly)
    encoder: dict = Field(default_factory=dict)  # the libx264 settings used: preset, crf, tune, threads
    stage_ms: dict[str, float] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)


class _EncoderThread:
    """Runs the MP4 writer on its own thread so H.264 encoding overlaps engine and compositor work."""

    def __init__(self, writer: Mp4Writer, timer: StageTimer, depth: int = 8) -> None:
        self._writer = writer
        self._timer = timer
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="mp4-encoder", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._error is not None:
                continue  # drain after a failure so the producer never blocks
            frame, audio = item
            try:
                start = time.perf_counter()
                self._writer.write_audio(audio)
                self._writer.write_frame(frame)
                self._timer.add("encode", time.perf_counter() - start)
            except BaseException as exc:  # noqa: BLE001 - re-raised on the caller's thread
                self._error = exc

    def put(self, frame: np.ndarray, audio: np.ndarray) -> None:
        """Queue one frame and its audio slice (blocks when the encoder is behind)."""
        if self._error is not None:
            raise self._error
        self._queue.put((frame, audio))

    def close(self) -> None:
        """Wait for everything queued to be written; re-raise an encoder failure."""
        self._queue.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error


def _scheduled(scheduler: PatchScheduler, frames: UtteranceFrames, batch: int) -> Iterator[list]:
    """Push the utterance through the scheduler in time-ordered batches; each yield is what it released."""
    n = len(frames.base_ids)
    for start in range(0, n, batch):
        span = slice(start, min(n, start + batch))
        yield scheduler.push(
            frames.features[span], frames.skip[span], frames.base_ids[span], list(range(start, span.stop))
        )
    yield scheduler.finish()


def check_speech(speech: Speech, max_seconds: float = MAX_AUDIO_SECONDS) -> None:
    """Refuse empty or over-long speech with a clear message."""
    if speech.frame_count == 0:
        raise MediaError(
            f"audio{' ' + speech.source if speech.source else ''} is empty ({speech.seconds:.3f} s): "
            "nothing to render; give at least 40 ms of audio"
        )
    if speech.seconds > max_seconds:
        raise MediaError(
            f"audio is {speech.seconds:.0f} s long, over the {max_seconds:.0f} s limit of one render; "
            "split it, or raise the limit with --max-seconds"
        )


def render_speech_to_mp4(
    bundle: AvatarBundle,
    engine: Engine,
    speech: Speech,
    out_path: str | Path,
    *,
    accel: AccelConfig | None = None,
    silence: SilenceDetector | None = None,
    on_frame: Callable[[int, int], None] | None = None,
    quality: str = DEFAULT_QUALITY,
    encoder: H264Settings | None = None,
    persist_codebook: bool = True,
    phrase_blinks: PhraseBlinkConfig | None = None,
) -> RenderReport:
    """Render `speech` on `bundle` with `engine` into `out_path` (written atomically).

    `quality` picks the H.264 settings (QUALITY_LEVELS); `encoder` overrides them (reported as "custom");
    `phrase_blinks`: when blinks come at phrase ends (default PhraseBlinkConfig(); enabled=False: none).
    """
    check_speech(speech)
    settings = encoder or encoder_settings(quality)
    accel = resolve_accel(accel, engine)
    out_path = Path(out_path)
    timer = StageTimer()
    started = time.perf_counter()
    n = speech.frame_count
    compositor = Compositor(bundle, engine.patch_size)
    compositor.base.decode_ahead()  # the base pictures decode while the features are made
    with timer.stage("features"):
        frames = utterance_frames(bundle, engine, speech, accel, silence or SilenceDetector())
    notes: list[str] = []
    if frames.silent.all():
        notes.append("the audio is silent: the idle presenter is rendered with a closed mouth")
        log.warning(notes[-1])
    codebook = load_codebook(bundle, engine, accel) if accel.enabled and accel.codebook else None
    scheduler = PatchScheduler(bundle, engine, accel, codebook, timer)
    loop_length = len(bundle.idle_loop)
    blinks = PhraseEndBlinks.for_manifest(bundle.manifest, loop_length, phrase_blinks)
    phrase_starts: list[int] = []
    pcm16 = to_int16(speech.pcm[: n * SAMPLES_PER_FRAME])
    width, height = bundle.size
    batch = max(1, int(engine.batch_size)) * 2
    ttff_ms: float | None = None
    done = 0
    with Mp4Writer(
        out_path, width, height, fps=FPS, preset=settings.preset, crf=settings.crf, threads=settings.threads,
        tune=settings.tune,
    ) as writer:
        sink = _EncoderThread(writer, timer)
        try:
            for released in _scheduled(scheduler, frames, batch):
                for k, patch in released:
                    with timer.stage("compositor"):
                        lids = blinks.step(k, not frames.silent[k], k % loop_length) if blinks else 0.0
                        if blinks and blinks.started == k:
                            phrase_starts.append(k)
                        frame = compositor.compose_i420(int(frames.base_ids[k]), patch, lids=lids)
                    if ttff_ms is None:
                        ttff_ms = (time.perf_counter() - started) * 1000.0
                    sink.put(frame, pcm16[k * SAMPLES_PER_FRAME : (k + 1) * SAMPLES_PER_FRAME])
                    done += 1
                    if on_frame:
                        on_frame(done, n)
        finally:
            sink.close()
    if done != n:
        raise RuntimeError(f"rendered {done} of {n} frames")
    if codebook is not None and persist_codebook:
        save_codebook(codebook, bundle, engine)
    wall = time.perf_counter() - started
    stats = scheduler.stats
    return RenderReport(
        engine=engine.name,
        avatar=bundle.name,
        output=str(out_path),
        frames=n,
        width=width,
        height=height,
        audio_seconds=round(speech.seconds, 3),
        wall_seconds=round(wall, 3),
        realtime_factor=round(speech.seconds / wall, 3) if wall > 0 else 0.0,
        silent_frames=int(frames.silent.sum()),
        accel=accel.enabled,
        keyframes=stats.keyframes,
        codebook_hits=stats.codebook_hits,
        neural_frames=stats.neural_frames,
        infill_frames=stats.infill_frames,
        ttff_ms=round(ttff_ms or 0.0, 1),
        phrase_blinks=phrase_starts,
        quality="custom" if encoder is not None else quality,
        encoder=asdict(settings),
        stage_ms=timer.mean_ms(n),
        notes=notes,
    )

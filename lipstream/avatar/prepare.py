"""Avatar preparation: a presenter video (or photo) becomes an avatar bundle on disk."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import cv2
import numpy as np

from lipstream.audio.timeline import FPS
from lipstream.avatar import bundle as bf
from lipstream.avatar.blink import BlinkConfig, IdleBlinks, plan_idle_blinks, still_pictures
from lipstream.avatar.boxes import BoxConfig, crop_boxes
from lipstream.avatar.breathing import BreathingConfig
from lipstream.avatar.bundle_video import FOOTAGE, LOOP_VIDEO, bundle_video
from lipstream.avatar.capacity import MachineRoom, PrepareNeeds, RoomProbe, check_fits
from lipstream.avatar.gaps import fill_gaps
from lipstream.avatar.idle import IdleConfig, IdleStretch, choose_idle_stretch
from lipstream.avatar.masks import MaskConfig, nose_base_row
from lipstream.avatar.progress import frame_progress
from lipstream.avatar.stage_times import StageClock
from lipstream.avatar.still import StillClip
from lipstream.avatar.tracking import LANDMARK_COUNT, LANDMARK_MODEL, FaceTracker, TrackerConfig
from lipstream.avatar.video_source import VideoInfo, iter_frames, probe_video
from lipstream.errors import AvatarError, MediaError
from lipstream.heap import HeapTrimmer
from lipstream.media.gop_splice import GopAssembler
from lipstream.media.gop_video import Mp4FrameWriter, VideoEncoding, coded_i420, even_size
from lipstream.threads import read_ahead, usable_cores

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class PrepareConfig:
    """Everything prepare can be tuned with; defaults suit presenter clips."""

    min_seconds: float = 0.5  # a clip shorter than this is refused (a photo is fine)
    max_gap_seconds: float = 0.5  # longer face losses are refused instead of interpolated
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    box: BoxConfig = field(default_factory=BoxConfig)
    mask: MaskConfig = field(default_factory=MaskConfig)
    idle: IdleConfig = field(default_factory=IdleConfig)
    video: VideoEncoding = field(default_factory=VideoEncoding)
    blink: BlinkConfig = field(default_factory=BlinkConfig)
    breathing: BreathingConfig = field(default_factory=BreathingConfig)  # a photo's idle motion
    # a clip a little longer than the idle stretch keeps its frames after their one decode (issue 37: the
    # stretch's second decode made a 7 s clip the slowest of all to prepare, 24 frames/s; 10 s of 1080×1920
    # is 742 MiB, a peak of ~1.2 GB; from 10 s on a clip runs at 29 frames/s and more without)
    hold_seconds: float = 10.0
    hold_mb: float = 800.0


def check_name(name: str) -> str:
    """Return `name` if it is a safe folder name for an avatar, else raise AvatarError."""
    if not NAME_PATTERN.match(name or ""):
        raise AvatarError(
            f"invalid avatar name {name!r}; use letters, digits, '.', '_' or '-' (up to 64, no leading dot)"
        )
    return name


def idle_loop(frame_count: int) -> np.ndarray:
    """Forward then reverse over the whole clip (format 1's idle loop; upgrade keeps it)."""
    return IdleStretch(0, frame_count, 0.0, 0.0, "the whole clip").loop()


def crop_space(landmarks: np.ndarray, boxes: np.ndarray, size: int) -> np.ndarray:
    """Map source-pixel landmarks into each frame's size×size crop (the box resized to a square)."""
    x1, y1, x2, y2 = (boxes[:, i, None].astype(np.float32) for i in range(4))
    out = np.empty_like(landmarks, dtype=np.float32)
    out[..., 0] = (landmarks[..., 0] - x1) * (size / np.maximum(x2 - x1, 1.0))
    out[..., 1] = (landmarks[..., 1] - y1) * (size / np.maximum(y2 - y1, 1.0))
    return out


def nose_base_rows(crop_landmarks: np.ndarray) -> np.ndarray:
    """Per frame, the crop-space row of the nostril base (N float32; the masks are derived on load)."""
    return np.array([nose_base_row(lm) for lm in crop_landmarks], dtype=np.float32)


def check_source(source: str | Path) -> Path:
    """Return the source path, refusing a folder with its own message (it would read as 'does not exist')."""
    path = Path(source)
    if path.is_dir():
        raise MediaError(f"avatar source {path} is a folder; pass a video or image file")
    return path


BOOT_FRAMES = 16  # frames decoded and encoded ahead while the tracker's process starts (~100 MB at 1080p)
DECODE_AHEAD = 4  # frames decoded on a thread of their own while the tracker answers (~25 MB at 1080p)
LOOP_ENCODERS = 8  # x264 sessions at once for loop.mp4's GOPs, at most (a 6 s loop has 12; each holds ~25
# pictures of lookahead and references)


def decoded_ahead(info: VideoInfo, start: int = 0) -> Iterator[tuple[int, np.ndarray]]:
    """`iter_frames` decoded on a thread of its own, DECODE_AHEAD frames ahead (H.264 decoding releases the
    GIL: the decoder works while the caller waits for the tracker or the encoder)."""
    return read_ahead(iter_frames(info, start=start), DECODE_AHEAD, "decoding")


def _track_frames(
    info: VideoInfo, folder: Path, encoding: VideoEncoding, config: PrepareConfig, name: str, progress: bool,
    tracker: FaceTracker, clock: StageClock, hold: bool,
) -> tuple[np.ndarray, np.ndarray, list[str], StillClip | None, list[np.ndarray] | None]:
    """Decode every output frame once: track the face and encode footage.mp4 on the writer's thread, so
    no more than a few frames are in memory. Returns landmarks, found mask, notes, a photo's clip, and with
    `hold` every frame as the I420 picture encoded (a short clip, `_holds_frames`: its loop is made from
    them, with no second decode). Closes the tracker.

    While the tracker's process starts, up to BOOT_FRAMES frames are decoded and encoded ahead and tracked
    once it answers. A photo whose face is found gets frames appended: its breathing, blinking clip
    (`StillClip`), or with breathing off its eyes-closing pictures (`still_pictures`, one per lid height)."""
    n = info.frame_count
    landmarks = np.zeros((n, LANDMARK_COUNT, 2), dtype=np.float32)
    found = np.zeros(n, dtype=bool)
    clip: StillClip | None = None
    held: list[np.ndarray] | None = [] if hold else None
    waiting: list[tuple[int, np.ndarray]] = []
    bar = frame_progress("tracking the face", n + _still_frames(info, config), progress)
    footage = Mp4FrameWriter(folder / FOOTAGE, info.width, info.height, FPS, encoding)

    def track_waiting() -> None:
        for k, rgb in waiting:
            stage = "tracking" if tracker.frames else "tracker_start"  # the first answer waits for the start
            with clock.stage(stage):
                points = tracker.track(rgb)
            if points is not None:
                landmarks[k] = points
                found[k] = True
            advance()
        waiting.clear()

    with footage, tracker, bar as advance:
        last: np.ndarray | None = None
        for k, rgb in clock.timed("decoding", decoded_ahead(info)):
            with clock.stage("encoding"):
                if held is not None:
                    held.append(coded_i420(rgb, *footage.coded_size))
                    footage.append_i420(held[-1])
                else:
                    footage.append(rgb)
            waiting.append((k, rgb))
            if tracker.frames or len(waiting) >= BOOT_FRAMES or tracker.ready():
                track_waiting()
            last = rgb
        track_waiting()
        note = tracker.multiple_faces_note
        face = last is not None and info.is_still and bool(found[n - 1])
        if face and config.breathing.enabled:
            # the tracker's face models (its worker process) segment the photo too: no second process
            with clock.stage("breathing"):
                clip = StillClip.make(
                    last, landmarks[n - 1], config.blink, config.breathing, FPS, name, models=tracker.models
                )
                for k in range(n, clip.frames):
                    footage.append(clip.picture(k))
                    advance()
            landmarks, found = clip.landmarks, np.ones(clip.frames, dtype=bool)
        elif face and config.blink.enabled:
            with clock.stage("blinks"):
                extra = still_pictures(last, landmarks[n - 1], config.blink)
            with clock.stage("encoding"):
                for picture in extra:
                    footage.append(picture)
            landmarks = np.concatenate([landmarks, np.repeat(landmarks[n - 1 : n], len(extra), axis=0)])
            found = np.concatenate([found, np.ones(len(extra), dtype=bool)])
        tracker.close()
        clock.begin("encoding")  # leaving the block waits for the last frames of footage.mp4
    clock.end()
    return landmarks, found, [note] if note else [], clip, held


def _still_frames(info: VideoInfo, config: PrepareConfig) -> int:
    """Frames a photo's breathing clip adds to its own (0 for a clip, or with breathing off)."""
    if not (info.is_still and config.breathing.enabled):
        return 0
    return int(round(config.blink.photo_loop_s * FPS)) - info.frame_count


def _holds_frames(info: VideoInfo, config: PrepareConfig, memory_available: int) -> bool:
    """Whether every frame is kept as I420 after its one decode, the idle loop made from them: a clip no
    longer than the idle stretch (the stretch is all of it), or one of up to hold_seconds whose pictures fit
    in hold_mb and in half the memory available. Longer clips decode their idle stretch again once chosen."""
    if info.is_still:
        return False
    n = info.frame_count
    if n <= int(round(config.idle.max_seconds * FPS)):
        return True
    coded_w, coded_h = even_size(info.width, info.height)
    if n > config.hold_seconds * FPS or n * coded_w * coded_h * 3 // 2 > config.hold_mb * 2**20:
        return False
    return _needs(info, config, held=True).memory_bytes <= memory_available // 2


def _write_loop(
    info: VideoInfo, folder: Path, blinks: IdleBlinks, landmarks: np.ndarray, config: PrepareConfig,
    encoding: VideoEncoding, progress: bool, clock: StageClock, held: list[np.ndarray] | None,
) -> int:
    """loop.mp4: the stretch's pictures with the planned blinks drawn, played as `blinks.loop` (forward
    then back; a photo's pictures in blink order). The pictures are the footage's own I420 (`held`), or
    decoded again from the source (no second generation of compression); each is encoded as soon as the
    loop reaches it, and the stretch is held as I420 for the way back (at most max_seconds of frames).
    Returns its frames."""
    loop = blinks.loop
    first, stop = int(loop.min()), int(loop.max()) + 1
    pictures: dict[int, np.ndarray] = {}
    bar = frame_progress("encoding the idle loop", stop - first + len(loop), progress)
    gop = encoding.gop
    shared = {} if info.is_still else shared_gops(loop, blinks.closure, info.frame_count, gop)
    workers = min(usable_cores(), LOOP_ENCODERS)
    writer = GopAssembler(folder / LOOP_VIDEO, folder / FOOTAGE, encoding, FPS, workers=workers)
    position = 0  # the loop's first position not yet handed to the writer (a GOP boundary)

    def write_ready() -> None:
        nonlocal position
        while position < len(loop):
            end = min(position + gop, len(loop))
            if position // gop in shared:
                writer.copy(shared[position // gop])
            elif all(int(loop[p]) in pictures for p in range(position, end)):
                writer.encode([pictures[int(loop[p])] for p in range(position, end)])
            else:
                return
            advance(end - position)
            position = end

    def keep(k: int, picture: np.ndarray) -> None:
        if blinks.closure[k] > 0:
            with clock.stage("blinks"):
                rgb = picture if picture.ndim == 3 else rgb_of(picture, info.width, info.height)
                picture = blinks.draw(rgb, k, landmarks, config.blink)
        with clock.stage("encoding"):
            pictures[k] = picture if picture.ndim == 2 else coded_i420(picture, *writer.coded_size)
            write_ready()  # the loop so far, at once
        advance()

    with writer, bar as advance:
        rgb: np.ndarray | None = None
        if held is not None:
            for k in range(first, stop):
                keep(k, held[k])
        else:
            for k, rgb in clock.timed("decoding", decoded_ahead(info, first)):
                if k >= first:
                    keep(k, rgb)
                if k + 1 >= stop:
                    break
        for k in range(max(info.frame_count, first), stop):  # a photo's eyes-closing pictures, on the photo
            keep(k, rgb)
        clock.begin("encoding")  # leaving the block waits for the last GOPs of loop.mp4
    clock.end()
    return len(loop)


def shared_gops(loop: np.ndarray, closure: np.ndarray, footage_frames: int, gop: int) -> dict[int, int]:
    """The loop's GOPs that are footage.mp4's own GOPs unchanged, loop GOP -> footage GOP: consecutive frames
    from a GOP boundary of the footage, no blink drawn on them (copied into loop.mp4, not encoded again)."""
    shared: dict[int, int] = {}
    for g in range(len(loop) // gop):
        span = loop[g * gop : (g + 1) * gop].astype(np.int64)
        first = int(span[0])
        if first % gop or first + gop > footage_frames:
            continue
        if np.array_equal(span, first + np.arange(gop)) and not np.any(closure[span] > 0):
            shared[g] = first // gop
    return shared


def rgb_of(i420: np.ndarray, width: int, height: int) -> np.ndarray:
    """The RGB picture of a coded I420 picture (cut back to width×height)."""
    rgb = cv2.cvtColor(i420, cv2.COLOR_YUV2RGB_I420)
    return rgb if rgb.shape[:2] == (height, width) else np.ascontiguousarray(rgb[:height, :width])


def _idle_entry(stretch: IdleStretch, blinks: IdleBlinks, is_still: bool) -> dict:
    """manifest.json's `idle`: the stretch, why, and the blinks it shows."""
    entry = {**stretch.entry(FPS), "blinks": blinks.entry()}
    if is_still:
        entry["reason"] = f"a photo, played as a {blinks.seconds:g} s loop with {blinks.drawn} blinks drawn"
    return entry


def _needs(info: VideoInfo, config: PrepareConfig, held: bool = False) -> PrepareNeeds:
    loop_frames = 2 * min(info.frame_count, int(round(config.idle.max_seconds * FPS)))
    if info.is_still and (config.blink.enabled or config.breathing.enabled):
        loop_frames = int(round(config.blink.photo_loop_s * FPS))
    frames = info.frame_count + _still_frames(info, config)  # a breathing photo's clip is footage too
    held_frames = info.frame_count if held else 0
    return PrepareNeeds.estimate(frames, info.width, info.height, loop_frames, held_frames)


def prepare_avatar(
    source: str | Path,
    name: str,
    avatars_root: str | Path | None = None,
    force: bool = False,
    progress: bool = True,
    config: PrepareConfig | None = None,
    room: RoomProbe = MachineRoom.measure,
) -> bf.AvatarBundle:
    """Turn a presenter video or photo into a format-2 avatar bundle (written atomically) and open it.

    `room` measures the machine's free disk and memory (a test passes its own); a clip that does not
    fit is refused before any work. The manifest's `prepare_stages` says where the time went."""
    config = config or PrepareConfig()
    clock = StageClock()
    with clock.stage("setup"):
        check_name(name)
        final = bf.bundle_path(name, avatars_root)
        if final.exists() and not force:
            raise AvatarError(f"avatar '{name}' already exists at {final}; use --force to replace it")
        info = probe_video(check_source(source))
        if not info.is_still and info.frame_count < config.min_seconds * FPS:
            raise MediaError(
                f"{info.path} is too short ({info.frame_count} frames at {FPS} fps); give at least "
                f"{config.min_seconds:g} s of video, or a single photo"
            )
        machine = room(final.parent)
        hold = _holds_frames(info, config, machine.memory_available_bytes)
        check_fits(_needs(info, config, hold), machine, info.path.name, info.frame_count / FPS)
        HeapTrimmer().tune()  # thousands of frames cross threads: keep freed ones from staying resident
        # a photo that breathes is a clip of moving pictures, encoded as one
        encoding = config.video.for_frames(info.frame_count + _still_frames(info, config))
        tracker = FaceTracker(config.tracker)
    with tracker, bf.atomic_bundle_dir(final, force=force) as folder:
        tracker.start()  # its process imports mediapipe while the first frames are decoded and encoded
        landmarks, found, notes, clip, held = _track_frames(
            info, folder, encoding, config, name, progress, tracker, clock, hold
        )
        with clock.stage("arrays"):
            max_gap = max(1, int(round(config.max_gap_seconds * FPS)))
            np.save(folder / bf.TRACKED, np.asarray(found, dtype=bool).copy())  # before gaps are filled
            notes += fill_gaps(landmarks, found, max_gap, info.path.name, FPS)
            boxes = crop_boxes(landmarks, info.width, info.height, config.box)
            nose_base = nose_base_rows(crop_space(landmarks, boxes, bf.CROP_SIZE))
        source = info.frame_count  # a photo's added frames follow its own
        with clock.stage("idle_choice"):
            stretch = choose_idle_stretch(landmarks[:source], found[:source], FPS, config.idle)
        if clip is not None:  # the clip is the loop, played forward: loop.mp4 is the same pictures
            blinks = clip.blinks()
            with clock.stage("encoding"):
                shutil.copyfile(folder / FOOTAGE, folder / LOOP_VIDEO)
            loop_frames = clip.frames
        else:
            with clock.stage("blinks"):
                still = info.is_still
                blinks = plan_idle_blinks(stretch.loop(), landmarks, source, still, FPS, config.blink, name)
            loop_frames = _write_loop(
                info, folder, blinks, landmarks, config, encoding, progress, clock, held
            )
        held = None  # the stretch's pictures are free to go
        with clock.stage("arrays"):
            np.save(folder / bf.BOXES, boxes)
            np.save(folder / bf.LANDMARKS, landmarks)
            np.save(folder / bf.NOSE_BASE, nose_base)
            np.save(folder / bf.IDLE_LOOP, blinks.loop)
            face_width = float(np.median(landmarks[:, :, 0].max(axis=1) - landmarks[:, :, 0].min(axis=1)))
            video = bundle_video(folder, encoding, info.width, info.height, loop_frames)
            manifest = bf.Manifest(
                name=name,
                fps=FPS,
                frame_count=len(landmarks),
                width=info.width,
                height=info.height,
                source_file=info.path.name,
                source_fps=info.source_fps,
                landmark_model=LANDMARK_MODEL,
                landmark_count=LANDMARK_COUNT,
                face_width_px=round(face_width, 1),
                created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                notes=notes,
                video=video,
                mask=asdict(config.mask),
                box=asdict(config.box),
                idle=_idle_entry(stretch, blinks, info.is_still),
            )
        times = clock.finish()  # what is left (writing the manifest, the rename) is milliseconds
        manifest.prepare_seconds = round(times.total, 3)
        manifest.prepare_stages = times.entry()
        bf.write_manifest(folder, manifest)
    return bf.load_avatar(final)

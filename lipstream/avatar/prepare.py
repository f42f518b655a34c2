"""Avatar preparation: a presenter video (or photo) becomes an avatar bundle on disk."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from lipstream.audio.timeline import FPS
from lipstream.avatar import bundle as bf
from lipstream.avatar.boxes import BoxConfig, crop_boxes
from lipstream.avatar.frame_store import FrameStore
from lipstream.avatar.gaps import fill_gaps
from lipstream.avatar.masks import MaskConfig, mouth_masks
from lipstream.avatar.progress import frame_progress
from lipstream.avatar.tracking import LANDMARK_COUNT, LANDMARK_MODEL, FaceTracker, TrackerConfig
from lipstream.avatar.video_source import VideoInfo, iter_frames, probe_video
from lipstream.errors import AvatarError, MediaError

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class PrepareConfig:
    """Everything prepare can be tuned with; defaults suit presenter clips."""

    min_seconds: float = 0.5  # a clip shorter than this is refused (a photo is fine)
    max_gap_seconds: float = 0.5  # longer face losses are refused instead of interpolated
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    box: BoxConfig = field(default_factory=BoxConfig)
    mask: MaskConfig = field(default_factory=MaskConfig)


def check_name(name: str) -> str:
    """Return `name` if it is a safe folder name for an avatar, else raise AvatarError."""
    if not NAME_PATTERN.match(name or ""):
        raise AvatarError(
            f"invalid avatar name {name!r}; use letters, digits, '.', '_' or '-' (up to 64, no leading dot)"
        )
    return name


def idle_loop(frame_count: int) -> np.ndarray:
    """Forward then reverse frame order that loops without a jump (end frames not shown twice)."""
    forward = np.arange(frame_count, dtype=np.int32)
    return np.concatenate([forward, forward[-2:0:-1]]) if frame_count > 2 else forward


def crop_space(landmarks: np.ndarray, boxes: np.ndarray, size: int) -> np.ndarray:
    """Map source-pixel landmarks into each frame's size×size crop (the box resized to a square)."""
    x1, y1, x2, y2 = (boxes[:, i, None].astype(np.float32) for i in range(4))
    out = np.empty_like(landmarks, dtype=np.float32)
    out[..., 0] = (landmarks[..., 0] - x1) * (size / np.maximum(x2 - x1, 1.0))
    out[..., 1] = (landmarks[..., 1] - y1) * (size / np.maximum(y2 - y1, 1.0))
    return out


def check_source(source: str | Path) -> Path:
    """Return the source path, refusing a folder with its own message (it would read as 'does not exist')."""
    path = Path(source)
    if path.is_dir():
        raise MediaError(f"avatar source {path} is a folder; pass a video or image file")
    return path


def _track_frames(
    info: VideoInfo, folder: Path, config: PrepareConfig, progress: bool
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Decode every output frame into frames.npy and track the face; returns landmarks, found mask, notes."""
    n = info.frame_count
    frames = FrameStore(folder / bf.FRAMES, n, info.height, info.width)
    landmarks = np.zeros((n, LANDMARK_COUNT, 2), dtype=np.float32)
    found = np.zeros(n, dtype=bool)
    try:
        bar = frame_progress("preparing avatar", n, progress)
        with FaceTracker(config.tracker) as tracker, bar as advance:
            for k, rgb in iter_frames(info):
                frames.append(rgb)
                points = tracker.track(rgb)
                if points is not None:
                    landmarks[k] = points
                    found[k] = True
                advance()
            note = tracker.multiple_faces_note
    except BaseException:
        frames.abort()
        raise
    frames.close()
    return landmarks, found, [note] if note else []


def prepare_avatar(
    source: str | Path,
    name: str,
    avatars_root: str | Path | None = None,
    force: bool = False,
    progress: bool = True,
    config: PrepareConfig | None = None,
) -> bf.AvatarBundle:
    """Turn a presenter video or photo into an avatar bundle (written atomically) and open it."""
    config = config or PrepareConfig()
    started = time.perf_counter()
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
    with bf.atomic_bundle_dir(final, force=force) as folder:
        landmarks, found, notes = _track_frames(info, folder, config, progress)
        max_gap = max(1, int(round(config.max_gap_seconds * FPS)))
        np.save(folder / bf.TRACKED, np.asarray(found, dtype=bool).copy())  # before gaps are filled
        notes += fill_gaps(landmarks, found, max_gap, info.path.name, FPS)
        boxes = crop_boxes(landmarks, info.width, info.height, config.box)
        masks, nose_base = mouth_masks(crop_space(landmarks, boxes, bf.CROP_SIZE), bf.CROP_SIZE, config.mask)
        np.save(folder / bf.BOXES, boxes)
        np.save(folder / bf.LANDMARKS, landmarks)
        np.save(folder / bf.MASKS, masks)
        np.save(folder / bf.NOSE_BASE, nose_base)
        np.save(folder / bf.IDLE_LOOP, idle_loop(info.frame_count))
        face_width = float(np.median(landmarks[:, :, 0].max(axis=1) - landmarks[:, :, 0].min(axis=1)))
        manifest = bf.Manifest(
            name=name,
            fps=FPS,
            frame_count=info.frame_count,
            width=info.width,
            height=info.height,
            source_file=info.path.name,
            source_fps=info.source_fps,
            landmark_model=LANDMARK_MODEL,
            landmark_count=LANDMARK_COUNT,
            face_width_px=round(face_width, 1),
            created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            prepare_seconds=round(time.perf_counter() - started, 3),
            notes=notes,
        )
        bf.write_manifest(folder, manifest)
    return bf.load_avatar(final)

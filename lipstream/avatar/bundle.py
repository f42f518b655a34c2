"""The avatar bundle: a folder with manifest.json and .npy arrays (see docs/bundle-format.md)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, Field

from lipstream.avatar.bundle_video import BundleVideo, VideoFrames
from lipstream.avatar.masks import MaskConfig, MaskSequence
from lipstream.errors import AvatarError
from lipstream.files import atomic_file, atomic_folder
from lipstream.paths import avatars_dir

FORMAT_VERSION = 2  # what prepare and upgrade write; format 1 (raw frames) is still read
READABLE_VERSIONS = (1, 2)
SAMPLE_CLIP = "sample_presenter.mp4"  # `avatar sample`'s source file, as its manifest records it
CROP_SIZE = 256  # masks and engine patches live in this crop space (the box resized to CROP_SIZE²)

MANIFEST = "manifest.json"
FRAMES = "frames.npy"  # format 1: N×H×W×3 uint8 RGB, memory-mapped on read
BOXES = "boxes.npy"  # N×4 int32 (x1, y1, x2, y2), source pixels, exclusive x2/y2
LANDMARKS = "landmarks.npy"  # N×L×2 float32 face landmarks in source pixels
MASKS = "masks.npy"  # format 1: N×CROP_SIZE×CROP_SIZE uint8 mouth blend mask in crop space
NOSE_BASE = "nose_base.npy"  # N float32: nostril-base row in crop space; mask is 0 at and above it
IDLE_LOOP = "idle_loop.npy"  # M int32 frame indices: a stretch forward then reverse
TRACKED = "tracked.npy"  # N bool: the face was tracked (False: interpolated); optional, older bundles lack it
ENGINES_DIR = "engines"  # engines/<engine name>/... per-engine caches


class Manifest(BaseModel):
    """manifest.json: what the bundle holds and how it was made."""

    format_version: int = FORMAT_VERSION
    name: str
    fps: int = 25
    frame_count: int
    width: int
    height: int
    source_file: str
    source_fps: float | None = None
    crop_size: int = CROP_SIZE
    landmark_model: str = ""
    landmark_count: int = 0
    face_width_px: float = 0.0
    created_at: str = ""
    prepare_seconds: float = 0.0
    prepare_stages: dict[str, float] = Field(default_factory=dict)  # seconds per stage (stage_times.py)
    notes: list[str] = Field(default_factory=list)
    engines: dict[str, dict] = Field(default_factory=dict)  # engine name -> what it cached
    video: BundleVideo | None = None  # format 2: the two videos holding the frames
    mask: dict = Field(default_factory=dict)  # format 2: MaskConfig the masks are derived with (defaults)
    box: dict = Field(default_factory=dict)  # BoxConfig the boxes were made with (empty: a 10 px chin margin)
    idle: dict = Field(default_factory=dict)  # format 2: which stretch the idle loop plays, and why

    @property
    def blinks_planned(self) -> bool:
        """Whether prepare planned its idle loop's blinks (bundles prepared before it did say nothing, and
        a photo's or a never-blinking clip's loop then has none: `prepare --force` adds them)."""
        return "blinks" in self.idle

    def drawn_blink_starts(self) -> list[int] | None:
        """Loop positions where the idle loop's drawn blinks begin (maybe none: a short stretch); None when
        lipstream does not draw its blinks (the footage blinks by itself, blinks are off, or it was prepared
        before the positions were recorded: `prepare --force` records them)."""
        blinks = self.idle.get("blinks") or {}
        if "starts" not in blinks:
            return None
        return [int(k) for k in blinks["starts"]]

    def blink_note(self) -> str | None:
        """What to tell a user whose avatar was prepared before blinks were drawn; None when they were."""
        if self.blinks_planned:
            return None
        if self.source_file == SAMPLE_CLIP:
            again = f"lipstream avatar sample --name {self.name} --force"
        else:
            again = f"lipstream avatar prepare {self.source_file} --name {self.name} --force"
        footage = "its idle loop blinks only if the footage does"
        return f"prepared before blinks were drawn ({footage}): `{again}` adds them"


@dataclass
class AvatarBundle:
    """A prepared avatar read back from disk; arrays are memory-mapped where large."""

    path: Path
    manifest: Manifest
    frames: Any  # N×H×W×3 uint8 by frame id: a memory-mapped array (format 1) or VideoFrames (format 2)
    boxes: np.ndarray
    landmarks: np.ndarray
    masks: Any  # N×256×256 uint8 by frame id: memory-mapped (format 1) or MaskSequence (format 2)
    nose_base: np.ndarray
    idle_loop: np.ndarray
    tracked: np.ndarray | None = None  # None for bundles prepared before tracked.npy existed
    derived: dict = field(default_factory=dict, repr=False)  # values computed from the bundle, kept with it

    @property
    def name(self) -> str:
        """The avatar's name."""
        return self.manifest.name

    @property
    def frame_count(self) -> int:
        """Number of source frames (before the idle ping-pong)."""
        return self.manifest.frame_count

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the frames in pixels."""
        return self.manifest.width, self.manifest.height

    @property
    def loop_video(self) -> Path | None:
        """loop.mp4, the idle loop as shown (format 2); None for a format-1 bundle."""
        video = self.manifest.video
        return self.path / video.loop if video is not None else None

    @property
    def display_frames(self) -> np.ndarray:
        """The source frames the idle loop shows, sorted (the only ones a render or stream draws on)."""
        return np.unique(np.asarray(self.idle_loop, dtype=np.int64))

    def base_frame_index(self, tick: int) -> int:
        """Source frame shown at display tick `tick` (the idle loop wraps around)."""
        return int(self.idle_loop[tick % len(self.idle_loop)])

    def base_frame_indices(self, first_tick: int, count: int) -> np.ndarray:
        """Source frames shown at display ticks first_tick .. first_tick + count - 1 (int64)."""
        ticks = np.arange(first_tick, first_tick + count, dtype=np.int64)
        return self.idle_loop[ticks % len(self.idle_loop)].astype(np.int64)

    def crop_landmarks(self, frame_index: int) -> np.ndarray:
        """Landmarks of a frame mapped into crop space (CROP_SIZE×CROP_SIZE)."""
        x1, y1, x2, y2 = (float(v) for v in self.boxes[frame_index])
        pts = self.landmarks[frame_index].astype(np.float32).copy()
        pts[:, 0] = (pts[:, 0] - x1) * (CROP_SIZE / max(x2 - x1, 1.0))
        pts[:, 1] = (pts[:, 1] - y1) * (CROP_SIZE / max(y2 - y1, 1.0))
        return pts

    def engine_dir(self, engine: str) -> Path:
        """Folder for an engine's caches inside the bundle."""
        return self.path / ENGINES_DIR / engine

    def update_engine_entry(self, engine: str, entry: dict) -> None:
        """Record what an engine cached, rewriting manifest.json atomically."""
        self.manifest.engines[engine] = entry
        write_manifest(self.path, self.manifest)


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """Write manifest.json atomically (temp file, then rename)."""
    with atomic_file(folder / MANIFEST, "w") as fh:
        json.dump(manifest.model_dump(), fh, indent=2)
        fh.write("\n")


@contextmanager
def atomic_bundle_dir(final: Path, force: bool = False) -> Iterator[Path]:
    """Yield a temp folder beside `final`; on success it replaces `final`, on failure it is removed."""
    final = Path(final)
    exists = AvatarError(f"avatar '{final.name}' already exists at {final}; use --force to replace it")
    with atomic_folder(final, force, exists) as tmp:
        yield tmp


def bundle_path(name: str, root: str | os.PathLike | None = None) -> Path:
    """Folder of the avatar called `name`."""
    return avatars_dir(root) / name


def list_avatars(root: str | os.PathLike | None = None) -> list[str]:
    """Names of the complete bundles under the avatars folder (hidden temp folders skipped)."""
    base = avatars_dir(root)
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if not p.name.startswith(".") and (p / MANIFEST).is_file())


class SharedBundles:
    """The avatars open on a server, one AvatarBundle per avatar for all its sessions, so what a bundle
    derives on load (format 2's masks) is made once and held once. A bundle is reopened when its
    manifest.json changes (a re-prepare or an upgrade). `get` reads files: call it off the event loop."""

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        self.root = root
        self._open: dict[str, tuple[int, AvatarBundle]] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> AvatarBundle:
        """The avatar called `name`, its shown frames' masks made (AvatarError as load_avatar)."""
        try:
            stamp = (bundle_path(name, self.root) / MANIFEST).stat().st_mtime_ns
        except OSError:
            return load_avatar(name, self.root)  # raises the unknown-avatar error
        with self._lock:
            held = self._open.get(name)
            if held is not None and held[0] == stamp:
                return held[1]
            bundle = load_avatar(name, self.root)
            for index in bundle.display_frames:  # the first session must not wait for them
                bundle.masks[int(index)]
            self._open[name] = (stamp, bundle)
            return bundle


def read_manifest(folder: Path) -> Manifest:
    """A bundle folder's manifest.json, parsed and of a format this lipstream reads (AvatarError if not)."""
    try:
        manifest = Manifest.model_validate_json((folder / MANIFEST).read_text())
    except Exception as exc:  # noqa: BLE001 - any parse failure is a malformed bundle
        raise AvatarError(f"avatar at {folder} has an unreadable manifest.json: {exc}") from exc
    if manifest.format_version not in READABLE_VERSIONS:
        raise AvatarError(
            f"avatar '{manifest.name}' uses bundle format {manifest.format_version}; this lipstream reads "
            f"formats {', '.join(map(str, READABLE_VERSIONS))}: upgrade lipstream or re-prepare the avatar"
        )
    return manifest


def load_avatar(name_or_path: str | os.PathLike, root: str | os.PathLike | None = None) -> AvatarBundle:
    """Open a bundle by name (under the avatars folder) or by path."""
    candidate = Path(name_or_path)
    folder = candidate if (candidate / MANIFEST).is_file() else bundle_path(str(name_or_path), root)
    if not (folder / MANIFEST).is_file():
        known = ", ".join(list_avatars(root)) or "none"
        raise AvatarError(
            f"unknown avatar '{name_or_path}' (known: {known}); "
            "create one with `lipstream avatar prepare VIDEO --name NAME` or `lipstream avatar sample`"
        )
    manifest = read_manifest(folder)

    def arr(fname: str, mmap: bool = False) -> np.ndarray:
        path = folder / fname
        if not path.is_file():
            raise AvatarError(f"avatar '{manifest.name}' is missing {fname}; re-prepare it with --force")
        return np.load(path, mmap_mode="r" if mmap else None)

    bundle = AvatarBundle(
        path=folder,
        manifest=manifest,
        frames=None,
        boxes=arr(BOXES),
        landmarks=arr(LANDMARKS),
        masks=None,
        nose_base=arr(NOSE_BASE),
        idle_loop=arr(IDLE_LOOP),
        tracked=np.load(folder / TRACKED) if (folder / TRACKED).is_file() else None,
    )
    if manifest.format_version == 1:
        bundle.frames, bundle.masks = arr(FRAMES, mmap=True), arr(MASKS, mmap=True)
        return bundle
    video = manifest.video
    if video is None:
        raise AvatarError(f"avatar '{manifest.name}' has no `video` entry in manifest.json; re-prepare it")
    for fname in (video.footage, video.loop):
        if not (folder / fname).is_file():
            raise AvatarError(f"avatar '{manifest.name}' is missing {fname}; re-prepare it with --force")
    bundle.frames = VideoFrames(folder, video, bundle.size, manifest.frame_count, bundle.idle_loop)
    mask_config = MaskConfig(**manifest.mask) if manifest.mask else MaskConfig()
    bundle.masks = MaskSequence(bundle.crop_landmarks, manifest.frame_count, manifest.crop_size, mask_config)
    return bundle

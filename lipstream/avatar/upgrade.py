"""`lipstream avatar upgrade NAME`: a format-1 bundle (raw frames) rewritten as format 2 in place, atomically.

The new bundle is written beside the old one and swapped in only when complete: an interrupted or failed
upgrade leaves the format-1 bundle exactly as it was. The idle loop is kept (renders stay the same), the
frames are encoded once from frames.npy (no second generation of compression), and the engines' caches
are carried over except what format 2 derives on load (viseme crops) or rebuilds (cache/).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lipstream.avatar import bundle as bf
from lipstream.avatar.bundle_video import FOOTAGE, LOOP_VIDEO, bundle_video
from lipstream.avatar.capacity import MachineRoom, PrepareNeeds, RoomProbe, check_fits
from lipstream.avatar.progress import frame_progress
from lipstream.errors import AvatarError
from lipstream.files import atomic_folder
from lipstream.media.gop_video import Mp4FrameWriter, VideoEncoding

CARRIED = (bf.BOXES, bf.LANDMARKS, bf.NOSE_BASE, bf.IDLE_LOOP, bf.TRACKED)  # small arrays, copied as they are
DERIVED_IN_FORMAT_2 = ("crops.npy",)  # engine files format 2 does not store (made from the videos on load)


@dataclass(frozen=True)
class UpgradeReport:
    """What an upgrade did, for the user."""

    name: str
    path: Path
    bytes_before: int
    bytes_after: int
    frames: int
    loop_frames: int
    seconds: float
    upgraded: bool = True  # False: the bundle was already format 2

    def line(self) -> str:
        """One line: sizes before and after, and time taken."""
        if not self.upgraded:
            size = self.bytes_after / 1e6
            return f"avatar '{self.name}' is already bundle format {bf.FORMAT_VERSION} ({size:,.1f} MB)"
        ratio = self.bytes_before / max(self.bytes_after, 1)
        return (
            f"upgraded avatar '{self.name}' to bundle format {bf.FORMAT_VERSION}: "
            f"{self.bytes_before / 1e6:,.1f} MB -> {self.bytes_after / 1e6:,.1f} MB ({ratio:.0f}x smaller), "
            f"{self.frames} frames, idle loop {self.loop_frames} frames, in {self.seconds:.1f} s "
            f"-> {self.path}"
        )


def folder_bytes(folder: Path) -> int:
    """Bytes of every file under `folder`."""
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


def _encode(path: Path, bundle: bf.AvatarBundle, order: np.ndarray, encoding: VideoEncoding, label: str,
            progress: bool) -> None:  # fmt: skip
    width, height = bundle.size
    bar = frame_progress(label, len(order), progress)
    with Mp4FrameWriter(path, width, height, bundle.manifest.fps, encoding) as writer, bar as advance:
        for index in order:
            writer.append(np.asarray(bundle.frames[int(index)]))
            advance()


def _carry_engines(old: bf.AvatarBundle, folder: Path) -> dict[str, dict]:
    """Copy engines/ without the files format 2 derives; return the manifest's engine entries to match."""
    source = old.path / bf.ENGINES_DIR
    if source.is_dir():
        shutil.copytree(source, folder / bf.ENGINES_DIR, ignore=shutil.ignore_patterns(*DERIVED_IN_FORMAT_2))
    engines = {name: dict(entry) for name, entry in old.manifest.engines.items()}
    engines.get("viseme", {}).pop("crops", None)
    return engines


def upgrade_avatar(
    name: str,
    avatars_root: str | Path | None = None,
    progress: bool = True,
    encoding: VideoEncoding | None = None,
    room: RoomProbe = MachineRoom.measure,
) -> UpgradeReport:
    """Rewrite the format-1 bundle `name` as format 2 in place (atomically); a format-2 one is left alone."""
    started = time.perf_counter()
    old = bf.load_avatar(name, avatars_root)
    before = folder_bytes(old.path)
    if old.manifest.format_version >= 2:
        return UpgradeReport(
            old.name, old.path, before, before, old.frame_count, len(old.idle_loop), 0.0, False
        )
    width, height = old.size
    loop = np.asarray(old.idle_loop)
    encoding = (encoding or VideoEncoding()).for_frames(old.frame_count)
    check_fits(PrepareNeeds.estimate(old.frame_count, width, height, len(loop)), room(old.path.parent),
               f"avatar '{old.name}'", old.frame_count / old.manifest.fps)  # fmt: skip
    with atomic_folder(old.path, True, AvatarError("unreachable")) as folder:
        _encode(folder / FOOTAGE, old, np.arange(old.frame_count), encoding, "encoding the footage", progress)
        _encode(folder / LOOP_VIDEO, old, loop, encoding, "encoding the idle loop", progress)
        for fname in CARRIED:
            if (old.path / fname).is_file():
                shutil.copyfile(old.path / fname, folder / fname)
        manifest = old.manifest.model_copy(deep=True)
        manifest.format_version = bf.FORMAT_VERSION
        manifest.engines = _carry_engines(old, folder)
        manifest.video = bundle_video(folder, encoding, width, height, len(loop))
        manifest.idle = {"start": 0, "stop": old.frame_count, "reason": "kept from format 1: the whole clip"}
        manifest.notes = [*manifest.notes, f"upgraded from bundle format 1 ({before / 1e6:,.1f} MB)"]
        bf.write_manifest(folder, manifest)
        after = folder_bytes(folder)
    return UpgradeReport(old.name, old.path, before, after, old.frame_count, len(loop),
                         time.perf_counter() - started)  # fmt: skip

"""Will a clip fit? The disk and memory a prepare needs, checked against the machine before work starts."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lipstream.errors import AvatarError

# Conservative per-pixel rates (measured on the sample at CRF 18: ~0.09 bit per pixel; noisy camera footage
# runs higher), so a clip that is accepted does fit.
FOOTAGE_BITS_PER_PIXEL = 0.35
LANDMARK_BYTES_PER_FRAME = 478 * 2 * 4 + 64  # landmarks float32 plus boxes, tracked, nose rows
FIXED_MEMORY_BYTES = 600 << 20  # decoder, face tracker, x264 and its lookahead, Python and NumPy
FRAMES_IN_FLIGHT = 32  # decoded RGB frames alive at once (queues, encoder lookahead, one GOP)
DISK_MARGIN = 1.25  # keep a quarter more free than the estimate


@dataclass(frozen=True)
class PrepareNeeds:
    """Estimated disk and memory a prepare of this clip takes."""

    frames: int
    width: int
    height: int
    loop_frames: int
    disk_bytes: int
    memory_bytes: int

    @classmethod
    def estimate(
        cls, frames: int, width: int, height: int, loop_frames: int, held_frames: int = 0
    ) -> PrepareNeeds:
        """From the clip's frame count and size, the idle loop's length, and the frames kept as I420 after
        their decode (a short clip's, instead of the stretch's)."""
        pixels = width * height
        video = int((frames + loop_frames) * pixels * FOOTAGE_BITS_PER_PIXEL / 8)
        disk = video + frames * LANDMARK_BYTES_PER_FRAME
        # held as I420 while loop.mp4 is written: the stretch's, or a short clip's every frame
        stretch = max(loop_frames // 2, held_frames) * pixels * 3 // 2
        per_frame = frames * LANDMARK_BYTES_PER_FRAME * 2
        memory = FIXED_MEMORY_BYTES + FRAMES_IN_FLIGHT * pixels * 3 + stretch + per_frame
        return cls(frames, width, height, loop_frames, disk, memory)


@dataclass(frozen=True)
class MachineRoom:
    """What this machine offers now: free disk where the bundle goes, and available memory."""

    disk_free_bytes: int
    memory_available_bytes: int

    @classmethod
    def measure(cls, folder: Path) -> MachineRoom:
        """Free disk on `folder`'s file system (its nearest existing parent) and MemAvailable."""
        folder = Path(folder)
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        return cls(shutil.disk_usage(folder).free, available_memory())


def available_memory() -> int:
    """MemAvailable from /proc/meminfo (bytes); a large number where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 1 << 50


RoomProbe = Callable[[Path], MachineRoom]


def check_fits(needs: PrepareNeeds, room: MachineRoom, source: str, seconds: float) -> None:
    """Raise AvatarError, with the numbers, when the clip cannot be prepared on this machine."""
    problems = []
    if needs.disk_bytes * DISK_MARGIN > room.disk_free_bytes:
        problems.append(
            f"the bundle needs about {needs.disk_bytes / 1e6:,.0f} MB of disk and only "
            f"{room.disk_free_bytes / 1e6:,.0f} MB is free"
        )
    if needs.memory_bytes > room.memory_available_bytes:
        problems.append(
            f"preparing needs about {needs.memory_bytes / 1e6:,.0f} MB of memory and only "
            f"{room.memory_available_bytes / 1e6:,.0f} MB is available"
        )
    if problems:
        raise AvatarError(
            f"{source} ({seconds:.0f} s, {needs.width}×{needs.height}) does not fit this machine: "
            + "; ".join(problems)
            + ". Free some space, or give a shorter or smaller clip (e.g. cut it with ffmpeg -t)"
        )

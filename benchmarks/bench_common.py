"""What the benchmark scripts share: the avatar they measure on."""

from __future__ import annotations

import os
import platform
from pathlib import Path

from lipstream.avatar.bundle import AvatarBundle, load_avatar
from lipstream.avatar.sample import build_sample_avatar
from lipstream.errors import AvatarError


def open_or_build_avatar(name: str) -> AvatarBundle:
    """The avatar called `name` in $LIPSTREAM_HOME (default ~/.lipstream), built as the sample if missing."""
    os.environ.setdefault("LIPSTREAM_HOME", str(Path.home() / ".lipstream"))
    try:
        return load_avatar(name)
    except AvatarError:
        return build_sample_avatar(name)


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (platform.processor() elsewhere), recorded with each figure."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()

"""Prepare the small avatar the Pipecat test plays, in a process of its own (so the test's process never loads
the face tracker, the way a player that only plays prepared avatars runs)."""

from __future__ import annotations

import sys

from lipstream.avatar.sample import build_sample_avatar
from lipstream.engines.registry import create_engine


def main(root: str) -> None:
    """Write a 2 s, 360×640 sample avatar with its viseme caches under `root`; print its folder."""
    bundle = build_sample_avatar(
        "pipecat", avatars_root=root, progress=False, width=360, height=640, seconds=2.0
    )
    create_engine("viseme").prepare(bundle)  # the caches a playback-only environment cannot build
    print(bundle.path)


if __name__ == "__main__":
    main(sys.argv[1])

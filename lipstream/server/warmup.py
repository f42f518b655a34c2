"""Warm a server's engine before it takes traffic: every avatar prepared, one real render call made.

A fresh Ray Serve replica runs this in its constructor, so its first session never pays the model load
(cold starts are the known pain of serverless avatars)."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel

from lipstream.audio.speech import Speech
from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.avatar.bundle import list_avatars, load_avatar

log = logging.getLogger(__name__)

WARM_SECONDS = 0.5  # of speech rendered once: every neural shape is exercised


class WarmupReport(BaseModel):
    """What the warm-up did and how long it took."""

    avatars: list[str]
    seconds: float


def warm_up(engine: Any, avatars_dir: Path | None) -> WarmupReport:
    """Prepare every avatar for `engine` and render one batch (of a modulated tone) for the first. Raises
    whatever fails: a replica that cannot warm up must not take traffic. (TTS voices warm themselves when
    loaded: SharedVoices.)"""
    started = time.perf_counter()
    names = list_avatars(avatars_dir)
    bundles = [load_avatar(name, avatars_dir) for name in names]
    for bundle in bundles:
        engine.prepare(bundle)
    if bundles:
        pcm = _warm_tone()
        features = engine.features(Speech(pcm))
        count = min(len(features), engine.batch_size)
        # frames the idle loop shows: the only ones anything is drawn on
        frame_ids = bundles[0].base_frame_indices(0, count)
        engine.render(bundles[0], features[:count], frame_ids)
    report = WarmupReport(avatars=names, seconds=round(time.perf_counter() - started, 3))
    log.info("warm-up done in %.2f s (%d avatars)", report.seconds, len(names))
    return report


def _warm_tone() -> np.ndarray:
    """Half a second of a syllable-rate modulated tone: loud enough to pass the silence gate."""
    t = np.arange(int(WARM_SECONDS * SAMPLE_RATE)) / SAMPLE_RATE
    return (0.3 * np.sin(2 * np.pi * 220.0 * t) * np.sin(2 * np.pi * 3.0 * t)).astype(np.float32)

"""Prepare reports where its time went: stage seconds adding up to its total, in the manifest and the CLI."""

from __future__ import annotations

import numpy as np
import pytest

from lipstream.avatar.cli import stages_line
from lipstream.avatar.stage_times import PrepareTimes, StageClock
from lipstream.avatar.video_source import iter_frames, probe_video


class Ticks:
    """A clock that advances by the seconds it is told, so stage sums are exact."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_stage_clock_adds_up_to_the_total() -> None:
    ticks = Ticks()
    clock = StageClock(clock=ticks)
    with clock.stage("tracking"):
        ticks.now += 2.0
    ticks.now += 0.5  # nothing claims this: it is `other`
    for _ in clock.timed("decoding", _slow_items(ticks, 3, 0.25)):
        ticks.now += 0.1  # the loop body's own time is not the decoder's
    clock.begin("encoding")
    ticks.now += 1.0
    clock.end()
    times = clock.finish()
    assert times.tracking == pytest.approx(2.0)
    assert times.decoding == pytest.approx(0.75)
    assert times.encoding == pytest.approx(1.0)
    assert times.other == pytest.approx(0.5 + 0.3)
    assert times.total == pytest.approx(4.55)
    entry = times.entry()
    assert sum(v for k, v in entry.items() if k != "total") == pytest.approx(entry["total"], abs=0.01)
    assert PrepareTimes.from_entry(entry).entry() == entry
    assert times.line().startswith("tracking 2.0 s, encoding 1.0 s, other 0.8 s, decoding 0.8 s")


def _slow_items(ticks: Ticks, count: int, seconds: float):
    for k in range(count):
        ticks.now += seconds
        yield k


def test_small_avatar_reports_its_stages(small_avatar) -> None:
    """The real prepare: every stage that must run took time, and they add up to prepare_seconds."""
    m = small_avatar.manifest
    stages = m.prepare_stages
    assert set(stages) == set(PrepareTimes().entry())
    for stage in ("setup", "tracker_start", "decoding", "tracking", "encoding", "idle_choice", "blinks"):
        assert stages[stage] > 0, stage
    assert stages["total"] == pytest.approx(m.prepare_seconds, abs=0.002)
    parts = sum(v for k, v in stages.items() if k != "total")
    assert parts == pytest.approx(stages["total"], rel=0.02, abs=0.01)
    assert stages["other"] < 0.25 * stages["total"]  # the stages account for most of the time
    line = stages_line(small_avatar)
    assert line.startswith("  time: ") and "tracking" in line and "encoding" in line


@pytest.mark.parametrize("start", [1, 24, 25, 26, 49])
def test_iter_frames_from_a_later_frame_is_the_same(sample_video_path, small_avatar, start) -> None:
    """The idle loop's second pass starts at its stretch (seeking to the key frame before it where the
    source has key frames: footage.mp4 has one every 25 frames): the frames from there on are the same."""
    for source in (sample_video_path, small_avatar.path / "footage.mp4"):
        info = probe_video(source)
        every = dict(iter_frames(info))
        later = list(iter_frames(info, start=start))
        assert [k for k, _ in later] == list(range(start, info.frame_count))
        for k, rgb in later:
            np.testing.assert_array_equal(rgb, every[k])

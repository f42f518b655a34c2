"""`lipstream render --quality`: each level's x264 settings reach the encoder and the report (issue 11)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lipstream.errors import MediaError
from lipstream.render.offline import (
    DEFAULT_QUALITY,
    QUALITY_LEVELS,
    H264Settings,
    encoder_settings,
    render_speech_to_mp4,
)

# encodes with each quality level (an 8 s module fixture): the full tier
pytestmark = pytest.mark.slow

# x264's "subme" per preset (x264 --fullhelp): the SEI options name no preset, this tells them apart
SUBME = {"ultrafast": 0, "superfast": 1, "veryfast": 2, "faster": 4, "fast": 6}


def x264_options(mp4: Path) -> dict[str, str]:
    """The options x264 wrote into the stream's SEI ("x264 - core ... options: cabac=1 ... crf=20.0 ...")."""
    found = re.search(rb"x264 - core .*? options: ([^\x00]*)", mp4.read_bytes())
    assert found, f"no x264 SEI in {mp4}"
    return dict(item.split("=", 1) for item in found.group(1).decode().split() if "=" in item)


@pytest.fixture(scope="module")
def speech():
    """About 1.5 s of speech from espeak-ng (fast, no model download)."""
    from lipstream.talk.voices.tts import create_tts

    return create_tts("espeak").synthesize("Good evening. The bridge reopened today.")


@pytest.fixture(scope="module")
def renders(small_avatar, speech, tmp_path_factory) -> dict:
    """One render of the small avatar per quality level: {level: (mp4 path, report)}."""
    from lipstream.engines.registry import create_engine

    engine = create_engine("viseme")
    engine.prepare(small_avatar)
    out = tmp_path_factory.mktemp("quality")
    paths = {level: out / f"{level}.mp4" for level in QUALITY_LEVELS}
    return {
        level: (path, render_speech_to_mp4(small_avatar, engine, speech, path, quality=level))
        for level, path in paths.items()
    }


def test_levels_and_default() -> None:
    assert list(QUALITY_LEVELS) == ["fast", "balanced", "best"]
    assert DEFAULT_QUALITY == "balanced"
    assert encoder_settings("balanced") == H264Settings("ultrafast", 20)
    assert encoder_settings("best") == H264Settings("superfast", 18)


def test_unknown_level_is_a_clear_error() -> None:
    expected = "unknown render quality 'medium'; choose one of fast, balanced, best"
    with pytest.raises(MediaError, match=expected):
        encoder_settings("medium")


@pytest.mark.parametrize("level", list(QUALITY_LEVELS))
def test_level_reaches_the_encoder(renders, level: str) -> None:
    mp4, report = renders[level]
    expected = QUALITY_LEVELS[level]
    options = x264_options(mp4)
    assert int(options["subme"]) == SUBME[expected.preset]
    assert float(options["crf"]) == expected.crf
    assert report.quality == level
    assert report.encoder == {"preset": expected.preset, "crf": expected.crf, "tune": None, "threads": 0}


def test_balanced_spends_more_bits_than_fast(renders) -> None:
    # same preset, lower CRF: more bits for a sharper picture
    sizes = {level: path.stat().st_size for level, (path, _) in renders.items()}
    assert sizes["balanced"] > sizes["fast"], sizes


def test_custom_settings_are_reported(small_avatar, speech, tmp_path: Path) -> None:
    from lipstream.engines.registry import create_engine

    engine = create_engine("viseme")
    engine.prepare(small_avatar)
    custom = H264Settings("faster", 26, tune="zerolatency", threads=1)
    report = render_speech_to_mp4(small_avatar, engine, speech, tmp_path / "c.mp4", encoder=custom)
    options = x264_options(tmp_path / "c.mp4")
    assert int(options["subme"]) == SUBME["faster"] and float(options["crf"]) == 26
    assert options["threads"] == "1" and options["bframes"] == "0"  # zerolatency turns B-frames off
    assert report.quality == "custom" and report.encoder["tune"] == "zerolatency"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "lipstream", "render", *args],
        capture_output=True, text=True, timeout=300, env=dict(os.environ),
    )


def test_cli_quality_reaches_report_and_stream(small_avatar, tmp_path: Path) -> None:
    out, report = tmp_path / "q.mp4", tmp_path / "q.json"
    res = _cli(
        "--avatar", small_avatar.name, "--avatars-dir", str(small_avatar.path.parent), "--text", "Hello.",
        "--voice", "espeak", "-o", str(out), "--report", str(report), "--no-progress", "--quality", "fast",
    )
    assert res.returncode == 0, res.stderr
    assert "quality fast: x264 ultrafast crf 23" in res.stdout
    assert json.loads(report.read_text())["encoder"]["preset"] == "ultrafast"
    assert int(x264_options(out)["subme"]) == SUBME["ultrafast"]


def test_cli_bad_quality_names_the_choices(tmp_path: Path) -> None:
    res = _cli("--avatar", "x", "--text", "Hi.", "-o", str(tmp_path / "x.mp4"), "--quality", "ultra")
    assert res.returncode == 2
    assert "invalid choice: 'ultra'" in res.stderr and "'fast', 'balanced', 'best'" in res.stderr
    assert not (tmp_path / "x.mp4").exists()

"""Bundle format 2: frames in two H.264 files read on demand, format 1 still read, upgraded in place
atomically, long clips prepared in bounded memory, clips that cannot fit refused up front."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import cv2
import numpy as np
import pytest

from lipstream.avatar import bundle as bf
from lipstream.avatar.capacity import MachineRoom
from lipstream.avatar.idle import choose_idle_stretch
from lipstream.avatar.prepare import prepare_avatar
from lipstream.avatar.upgrade import upgrade_avatar
from lipstream.edge.onnx_gate import psnr_db
from lipstream.engines.viseme.engine import VisemeEngine
from lipstream.errors import AvatarError
from lipstream.media.gop_video import GopReader, Mp4FrameWriter
from lipstream.render.compositor import Compositor

ROOMY = MachineRoom(disk_free_bytes=1 << 50, memory_available_bytes=1 << 50)


def _copy_bundle(bundle: bf.AvatarBundle, root: Path) -> Path:
    target = root / bundle.path.name
    shutil.copytree(bundle.path, target)
    return target


def _rendered(bundle: bf.AvatarBundle, engine: VisemeEngine, ids: np.ndarray) -> list[np.ndarray]:
    """Whole frames with a speaking mouth: what a render of this avatar shows at those frames."""
    features = np.tile(np.array([[0.6, 0.2, 0.0]], np.float32), (len(ids), 1))
    patches = engine.render(bundle, features, ids)
    comp = Compositor(bundle)
    return [comp.compose(int(fid), patch) for fid, patch in zip(ids, patches, strict=True)]


# ---- the video files --------------------------------------------------------------------------------


def test_gop_reader_gives_the_same_frames_in_any_order(tmp_path: Path) -> None:
    """Random, backward and forward access return the sequential decode; the budget bounds what is kept."""
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 255, (66, 41, 3), dtype=np.uint8)  # odd sides: coded as 42×66, cut back
    base = cv2.GaussianBlur(noise, (0, 0), 2.0)  # picture-like (smooth), not noise an encoder cannot keep
    frames = [np.roll(base, k, axis=1) for k in range(23)]
    writer = Mp4FrameWriter(tmp_path / "f.mp4", 41, 66, 25)
    for frame in frames:
        writer.append(frame)
    writer.close()
    forward = GopReader(tmp_path / "f.mp4", 23, (41, 66), 25)
    seq = [forward[k] for k in range(23)]
    assert seq[0].shape == (66, 41, 3) and not seq[0].flags.writeable
    assert all(psnr_db(a, b) > 30 for a, b in zip(seq, frames, strict=True))
    small = GopReader(tmp_path / "f.mp4", 23, (41, 66), 5)  # pretend GOPs of 5: seeks land on real key frames
    for k in (22, 3, 17, 0, 9, 21, 20, 19):
        assert np.array_equal(small[k], seq[k]), k
    one_gop = 5 * 66 * 3 // 2 * 42
    assert small.cached_bytes <= one_gop
    with pytest.raises(IndexError):
        small[23]
    ahead = GopReader(tmp_path / "f.mp4", 23, (41, 66), 5, prefetch=True)  # decode-ahead, smallest budget
    for k in range(23):
        assert np.array_equal(ahead[k], seq[k])
    assert ahead.decoded_gops <= 6  # 5 GOPs: the ones decoded ahead are not evicted before they are read


# ---- format 1 still read, and upgraded ---------------------------------------------------------------


@pytest.mark.slow
def test_format_1_bundle_still_loads_and_renders(v1_avatar) -> None:
    assert v1_avatar.manifest.format_version == 1 and v1_avatar.loop_video is None
    assert isinstance(v1_avatar.frames, np.memmap) and v1_avatar.masks.shape[0] == v1_avatar.frame_count
    frames = _rendered(v1_avatar, VisemeEngine(), np.array([0, 10]))
    assert frames[0].shape == (640, 360, 3)


def test_unknown_format_is_refused(small_avatar, tmp_path: Path) -> None:
    folder = _copy_bundle(small_avatar, tmp_path)
    manifest = json.loads((folder / bf.MANIFEST).read_text())
    manifest["format_version"] = 3
    (folder / bf.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(AvatarError, match="format 3; this lipstream reads formats 1, 2"):
        bf.load_avatar(folder)


@pytest.mark.slow
def test_upgrade_rewrites_format_1_in_place_with_the_same_renders(v1_avatar, tmp_path: Path) -> None:
    folder = _copy_bundle(v1_avatar, tmp_path)
    engine = VisemeEngine()
    ids = np.array([0, 13, 26, 49])
    before = _rendered(bf.load_avatar(folder), engine, ids)
    report = upgrade_avatar("old", tmp_path, progress=False, room=lambda _: ROOMY)
    assert report.upgraded and report.bytes_after < report.bytes_before / 5
    assert "MB ->" in report.line()
    new = bf.load_avatar(folder)
    assert new.manifest.format_version == 2 and not (folder / bf.FRAMES).exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]  # no temp or old folder left beside it
    np.testing.assert_array_equal(new.idle_loop, v1_avatar.idle_loop)  # the same loop plays
    for fid in (0, 25, 49):  # derived masks are the stored ones
        np.testing.assert_array_equal(new.masks[fid], v1_avatar.masks[fid])
    after = _rendered(new, VisemeEngine(), ids)
    for a, b in zip(before, after, strict=True):
        assert psnr_db(a, b) >= 40.0
    assert not upgrade_avatar("old", tmp_path, progress=False).upgraded  # a second run changes nothing


def test_interrupted_upgrade_leaves_format_1_intact(v1_avatar, tmp_path: Path, monkeypatch) -> None:
    folder = _copy_bundle(v1_avatar, tmp_path)
    manifest = (folder / bf.MANIFEST).read_bytes()
    files = sorted(p.relative_to(folder) for p in folder.rglob("*"))
    calls = {"n": 0}
    real_append = Mp4FrameWriter.append

    def append_then_ctrl_c(self, rgb):  # Ctrl-C arrives while the idle loop is being encoded
        calls["n"] += 1
        if calls["n"] == v1_avatar.frame_count + 7:
            raise KeyboardInterrupt
        real_append(self, rgb)

    monkeypatch.setattr(Mp4FrameWriter, "append", append_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        upgrade_avatar("old", tmp_path, progress=False, room=lambda _: ROOMY)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old"]
    assert (folder / bf.MANIFEST).read_bytes() == manifest
    assert sorted(p.relative_to(folder) for p in folder.rglob("*")) == files
    assert bf.load_avatar(folder).manifest.format_version == 1


def test_upgrade_cli_reports_sizes(v1_avatar, tmp_path: Path) -> None:
    _copy_bundle(v1_avatar, tmp_path)
    out = subprocess.run(
        [sys.executable, "-m", "lipstream", "avatar", "upgrade", "old", "--avatars-dir", str(tmp_path), "-q"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "upgraded avatar 'old' to bundle format 2" in out.stdout and "x smaller" in out.stdout


# ---- prepare: the idle stretch, long clips, clips that do not fit ------------------------------------


def test_idle_stretch_is_the_calm_closed_mouth_part() -> None:
    """Landmarks of a clip that talks (mouth moving, head moving) except for a still, closed stretch."""
    from lipstream.avatar.face_measures import INNER_LIP_PAIRS

    rng = np.random.default_rng(1)
    n, fps = 500, 25
    face = rng.uniform(100, 200, (478, 2)).astype(np.float32)
    face[33], face[263] = (100, 100), (200, 100)  # eye corners: the scale
    landmarks = np.repeat(face[None], n, axis=0)
    landmarks += rng.normal(0, 1.5, (n, 1, 2)).astype(np.float32)  # a restless head
    for upper, lower in INNER_LIP_PAIRS:
        landmarks[:, lower, 1] = landmarks[:, upper, 1] + rng.uniform(5, 25, n)  # talking
    calm = slice(300, 460)
    landmarks[calm] = face
    for upper, lower in INNER_LIP_PAIRS:
        landmarks[calm, lower, 1] = landmarks[calm, upper, 1] + 0.5
    tracked = np.ones(n, bool)
    stretch = choose_idle_stretch(landmarks, tracked, fps)
    assert stretch.stop - stretch.start == 150 and 300 <= stretch.start and stretch.stop <= 460
    loop = stretch.loop()
    assert len(loop) == 298 and np.abs(np.diff(loop)).max() == 1
    tracked[300:460] = False  # never loop frames the tracker lost
    lost = choose_idle_stretch(landmarks, tracked, fps)
    assert lost.stop <= 300 or lost.start >= 460


def _prepare_peak(clip: Path, name: str, root: Path) -> tuple[int, int, float]:
    """prepare_avatar in a fresh process: (frames, idle-loop frames, peak RSS in MiB)."""
    code = (
        "import resource\n"
        "from lipstream.avatar.prepare import prepare_avatar\n"
        f"b = prepare_avatar({str(clip)!r}, {name!r}, avatars_root={str(root)!r}, progress=False)\n"
        "print(b.frame_count, len(b.idle_loop), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    frames, loop, peak_kib = (int(v) for v in out.stdout.split())
    return frames, loop, peak_kib / 1024


@pytest.mark.slow
def test_long_clip_is_prepared_in_bounded_memory(tmp_path: Path) -> None:
    """A 30 s clip (750 frames) next to a 10 s one: raw frames would add 330 MiB; prepare's peak barely
    grows (nor did it for 60 s, 1500 frames). It picks a 6 s idle stretch, and frames read back."""
    from lipstream.avatar.sample import write_sample_video

    clips = {}
    for seconds in (10, 30):
        clips[seconds] = tmp_path / f"clip{seconds}.mp4"
        write_sample_video(clips[seconds], width=360, height=640, seconds=float(seconds))
    _, _, short_peak = _prepare_peak(clips[10], "short", tmp_path)
    frames, loop, peak = _prepare_peak(clips[30], "long", tmp_path)
    raw_growth = (750 - 250) * 640 * 360 * 3 / 2**20
    print(f"prepare peak: 10 s {short_peak:.0f} MiB, 30 s {peak:.0f} MiB (raw frames add {raw_growth:.0f})")
    assert frames == 750 and loop == 298
    assert peak - short_peak < 0.25 * raw_growth, f"{short_peak:.0f} -> {peak:.0f} MiB"
    bundle = bf.load_avatar(tmp_path / "long")
    assert sum(p.stat().st_size for p in bundle.path.iterdir()) < 25e6
    import av

    with av.open(str(clips[30])) as container:
        for k, frame in enumerate(container.decode(video=0)):
            if k in (3, 377, 749):
                assert psnr_db(frame.to_ndarray(format="rgb24"), np.asarray(bundle.frames[k])) > 38


def test_clip_that_cannot_fit_is_refused_before_any_work(sample_video_path: Path, tmp_path: Path) -> None:
    def prepare(room: MachineRoom) -> None:
        prepare_avatar(sample_video_path, "big", avatars_root=tmp_path, progress=False, room=lambda _: room)

    with pytest.raises(AvatarError, match=r"needs about .* MB of disk and only 0 MB is free"):
        prepare(MachineRoom(disk_free_bytes=100_000, memory_available_bytes=1 << 50))
    with pytest.raises(AvatarError, match=r"MB of memory and only 52 MB is available"):
        prepare(MachineRoom(disk_free_bytes=1 << 50, memory_available_bytes=50 << 20))
    assert not any(tmp_path.iterdir())


def test_photo_bundle_round_trips(tmp_path: Path) -> None:
    """A photo that does not breathe: it and its eyes-closing pictures are near-lossless frames, the same
    pictures from both files (a breathing photo is a clip, encoded as one)."""
    from lipstream.avatar.breathing import BreathingConfig
    from lipstream.avatar.prepare import PrepareConfig
    from lipstream.avatar.sample import presenter_frame

    photo = presenter_frame(288, 512)
    cv2.imwrite(str(tmp_path / "p.png"), cv2.cvtColor(photo, cv2.COLOR_RGB2BGR))
    still = PrepareConfig(breathing=BreathingConfig(enabled=False))
    bundle = prepare_avatar(tmp_path / "p.png", "p", tmp_path / "a", progress=False, config=still)
    assert bundle.manifest.video is not None and bundle.manifest.video.crf == 8
    shown = set(bundle.idle_loop.tolist())  # the open eyes and the shut ones at least (a blink's curve may
    assert {0, bundle.frame_count - 1} <= shown <= set(range(bundle.frame_count))  # pass a mid lid by)
    streamed = cv2.cvtColor(cv2.cvtColor(photo, cv2.COLOR_RGB2YUV_I420), cv2.COLOR_YUV2RGB_I420)
    assert psnr_db(np.asarray(bundle.frames[0]), streamed) > 42
    # footage.mp4 holds the same pictures as loop.mp4 (each drawn once, encoded in both)
    gop = bundle.manifest.video.gop
    footage = GopReader(bundle.path / "footage.mp4", bundle.frame_count, bundle.size, gop)
    for k in range(bundle.frame_count):
        assert psnr_db(np.asarray(footage[k]), np.asarray(bundle.frames[k])) > 42


def test_server_sessions_share_one_open_bundle(small_avatar, tmp_path: Path) -> None:
    """SharedBundles: one object per avatar (masks made once, at open); reopened after a re-prepare."""
    import os

    _copy_bundle(small_avatar, tmp_path)
    bundles = bf.SharedBundles(tmp_path)
    first = bundles.get("small")
    assert bundles.get("small") is first
    assert len(first.masks._made) == len(first.display_frames)  # made before any session asks
    manifest = tmp_path / "small" / bf.MANIFEST
    stat = manifest.stat()
    os.utime(manifest, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert bundles.get("small") is not first
    with pytest.raises(AvatarError, match="unknown avatar"):
        bundles.get("nobody")

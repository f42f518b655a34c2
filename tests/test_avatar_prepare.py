"""Avatar preparation through the real pipeline: PyAV-encoded clip → mediapipe tracking → bundle on disk."""

from __future__ import annotations

import dataclasses

import numpy as np

from lipstream.avatar.bundle import CROP_SIZE, Manifest, load_avatar
from lipstream.edge.onnx_gate import psnr_db


def test_small_avatar_bundle_reads_back(small_avatar, sample_clip):
    """The fixture bundle has every array with consistent shapes, and a manifest that describes it."""
    _, motion = sample_clip
    b = load_avatar(small_avatar.path)
    n = b.frame_count
    assert n == 50 == len(motion.dy)
    assert b.frames.shape == (n, 640, 360, 3) and b.frames.dtype == np.uint8
    assert b.boxes.shape == (n, 4) and b.boxes.dtype == np.int32
    assert b.landmarks.shape == (n, 478, 2)
    assert b.masks.shape == (n, CROP_SIZE, CROP_SIZE) and b.masks.dtype == np.uint8
    assert b.nose_base.shape == (n,)
    assert isinstance(b.manifest, Manifest)
    assert b.manifest.fps == 25 and b.manifest.width == 360 and b.manifest.height == 640
    assert b.manifest.source_file == "presenter.mp4"
    assert 40 < b.manifest.face_width_px < 120


def test_frames_match_the_source_clip(small_avatar, sample_video_path):
    """Frames stored in the bundle are the decoded source frames, in order, visually lossless (≥ 40 dB)."""
    import av

    with av.open(str(sample_video_path)) as c:
        decoded = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
    assert len(decoded) == small_avatar.frame_count
    loop = np.asarray(small_avatar.idle_loop)
    starts = small_avatar.manifest.drawn_blink_starts() or []  # drawn lids differ from the source
    blinking = {int(loop[p]) for s in starts for p in range(s, min(s + 10, len(loop)))}
    frames = [i for i in (0, 17, 49, 30, 2, 40, 8) if i not in blinking]
    assert len(frames) >= 4
    for i in frames:  # out of order too: frames are decoded GOP by GOP on demand
        assert psnr_db(decoded[i], np.asarray(small_avatar.frames[i])) >= 40.0, i


def test_mask_is_zero_at_and_above_nose_base_in_every_frame(small_avatar):
    """The ghost-nostril guarantee: no nonzero mask pixel at or above the nostril-base row."""
    rows = np.arange(CROP_SIZE)
    for mask, nose in zip(small_avatar.masks, small_avatar.nose_base, strict=True):
        above = rows <= np.ceil(nose)
        assert mask[above].max() == 0
        assert mask[~above].max() == 255


def test_mask_covers_lips_and_chin(small_avatar):
    """Every lip landmark and the chin are fully inside the mask (the engine warps them)."""
    from lipstream.avatar.masks import LIPS

    for i in range(0, small_avatar.frame_count, 7):
        pts = small_avatar.crop_landmarks(i)
        mask = small_avatar.masks[i]
        for j in (*LIPS, 17, 152):  # lips, lower-lip bottom, chin
            x, y = (int(round(v)) for v in pts[j])
            assert mask[y, x] >= 200, (i, j, mask[y, x])
        # The forehead and eyes are never in the mask.
        for j in (10, 33, 263, 1):  # forehead, eye corners, nose tip
            x, y = (int(round(v)) for v in pts[j])
            assert mask[min(max(y, 0), CROP_SIZE - 1), min(max(x, 0), CROP_SIZE - 1)] == 0


def test_box_follows_known_head_motion(small_avatar, sample_clip):
    """The box centre follows the synthetic bob within a few pixels (MuseTalk box convention)."""
    _, motion = sample_clip
    boxes = small_avatar.boxes.astype(np.float64)
    cy = (boxes[:, 1] + boxes[:, 3]) / 2
    cx = (boxes[:, 0] + boxes[:, 2]) / 2
    err_y = (cy - cy.mean()) - (motion.dy - motion.dy.mean())
    err_x = (cx - cx.mean()) - (motion.dx - motion.dx.mean())
    assert np.ptp(motion.dy) > 10  # the clip really moves
    assert np.abs(err_y).mean() < 1.5 and np.abs(err_y).max() < 3
    assert np.abs(err_x).mean() < 1.5


def test_the_margin_under_the_chin_grows_with_the_face() -> None:
    from lipstream.avatar.boxes import BoxConfig, chin_margins, extra_margin

    boxes = np.array([[0, 0, 100, 80], [0, 0, 300, 274], [0, 0, 600, 600]], dtype=np.float64)
    margins = extra_margin(boxes, BoxConfig())
    assert np.allclose(margins, [10.0, 27.4, 60.0])
    assert np.allclose(extra_margin(boxes, BoxConfig(extra_margin_share=0.0)), 10.0)  # MuseTalk's own 10 px
    # what a reader of the bundle (MuseTalk v1.0's crop) recovers from the final boxes and manifest.box
    final = boxes.copy()
    final[:, 3] += margins
    assert np.allclose(chin_margins(final, dataclasses.asdict(BoxConfig())), margins)
    assert np.allclose(chin_margins(final, {}), 10.0)  # a bundle prepared before the entry: a fixed 10 px


def test_box_follows_musetalk_convention(small_avatar):
    """y1 = nose bridge - (chin - nose bridge), y2 = chin + the margin (10 px, or 7 % of the box's height when
    that is more), x-extent of the landmarks (± smoothing)."""
    from lipstream.avatar.boxes import NOSE_BRIDGE

    lm = small_avatar.landmarks
    chin = lm[:, :, 1].max(axis=1)
    nose = lm[:, NOSE_BRIDGE, 1]
    b = small_avatar.boxes
    y1 = 2 * nose - chin
    margin = np.maximum(10, 0.07 * (chin - y1))
    assert np.abs(b[:, 3] - (chin + margin)).max() < 3
    assert np.abs(b[:, 1] - y1).max() < 3
    assert np.abs(b[:, 0] - lm[:, :, 0].min(axis=1)).max() < 3
    assert np.abs(b[:, 2] - lm[:, :, 0].max(axis=1)).max() < 3


def test_idle_loop_is_forward_then_reverse(small_avatar):
    """Idle loop: 0..N-1 then N-2..1, so wrapping around never repeats or jumps."""
    loop = small_avatar.idle_loop
    n = small_avatar.frame_count
    assert list(loop) == list(range(n)) + list(range(n - 2, 0, -1))
    assert np.abs(np.diff(np.concatenate([loop, loop[:1]]))).max() == 1

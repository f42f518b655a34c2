"""Compositor: only mouth-mask pixels change; the I420 path matches the RGB path exactly."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from lipstream.render.compositor import Compositor


def _noise_patch(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (256, 256, 3), dtype=np.uint8)


def _mask_in_frame(comp: Compositor, index: int) -> np.ndarray:
    """The blend mask at frame size (0 outside the changeable rectangle)."""
    full = np.zeros((comp.height, comp.width), dtype=np.uint16)
    geo = comp.geometry(index)
    x0, y0, x1, y1 = geo.rect
    full[y0:y1, x0:x1] = geo.alpha[..., 0]
    return full


@pytest.mark.parametrize("index", [0, 17, 49])
def test_pixels_outside_mask_are_bit_identical(small_avatar, index: int) -> None:
    comp = Compositor(small_avatar)
    base = np.asarray(small_avatar.frames[index])
    out = comp.compose(index, _noise_patch(index))
    mask = _mask_in_frame(comp, index)
    assert mask.any(), "the mask must cover the mouth"
    assert np.array_equal(out[mask == 0], base[mask == 0])
    assert not np.array_equal(out[mask > 0], base[mask > 0]), "inside the mask the patch must show"


def test_full_alpha_takes_the_patch_exactly(small_avatar) -> None:
    comp = Compositor(small_avatar)
    patch = _noise_patch(3)
    out = comp.compose(5, patch)
    geo = comp.geometry(5)
    bx1, by1, bx2, by2 = geo.box
    resized = cv2.resize(patch, (bx2 - bx1, by2 - by1), interpolation=cv2.INTER_LINEAR)
    mask = _mask_in_frame(comp, 5)
    full = np.argwhere(mask == 255)
    assert len(full) > 50
    for y, x in full[:: max(1, len(full) // 200)]:
        assert np.array_equal(out[y, x], resized[y - by1, x - bx1])


def test_nothing_changes_at_or_above_the_nose_base(small_avatar) -> None:
    comp = Compositor(small_avatar)
    for index in range(0, small_avatar.frame_count, 7):
        out = comp.compose(index, _noise_patch(index))
        x1, y1, x2, y2 = small_avatar.boxes[index]
        nose_row = y1 + float(small_avatar.nose_base[index]) * (y2 - y1) / 256.0
        top = int(np.floor(nose_row))
        assert np.array_equal(out[: top + 1], np.asarray(small_avatar.frames[index])[: top + 1])


def test_no_patch_gives_the_base_frame(small_avatar) -> None:
    comp = Compositor(small_avatar)
    assert np.array_equal(comp.compose(9, None), small_avatar.frames[9])


def test_i420_path_equals_converting_the_rgb_composite_v1(v1_avatar) -> None:
    """Format 1 (raw RGB frames): the I420 picture is exactly the RGB composite converted."""
    comp = Compositor(v1_avatar)
    for index in (0, 21):
        patch = _noise_patch(index)
        expected = cv2.cvtColor(comp.compose(index, patch), cv2.COLOR_RGB2YUV_I420)
        assert np.array_equal(comp.compose_i420(index, patch), expected)
    idle = cv2.cvtColor(np.ascontiguousarray(v1_avatar.frames[4]), cv2.COLOR_RGB2YUV_I420)
    assert np.array_equal(comp.compose_i420(4, None), idle)


def _decoded_loop_i420(bundle, frame_index: int) -> np.ndarray:
    """The frame's picture decoded from loop.mp4 by PyAV alone (its first place in the idle loop)."""
    import av

    position = int(np.flatnonzero(np.asarray(bundle.idle_loop) == frame_index)[0])
    with av.open(str(bundle.loop_video)) as container:
        for k, frame in enumerate(container.decode(video=0)):
            if k == position:
                return frame.to_ndarray(format="yuv420p")
    raise AssertionError(f"frame {frame_index} not in loop.mp4")


def test_i420_path_keeps_decoded_pixels_outside_the_mask_v2(small_avatar) -> None:
    """Format 2 (frames decoded from loop.mp4): where the mask is 0 the I420 picture is the decoded one bit
    for bit (no RGB round trip); inside it, the RGB composite converted."""
    comp = Compositor(small_avatar)
    w, h = small_avatar.size
    for index in (0, 21):
        decoded = _decoded_loop_i420(small_avatar, index)
        assert np.array_equal(comp.compose_i420(index, None), decoded)
        patch = _noise_patch(index)
        got = comp.compose_i420(index, patch)
        converted = cv2.cvtColor(comp.compose(index, patch), cv2.COLOR_RGB2YUV_I420)
        mask = _mask_in_frame(comp, index)
        still_y = mask == 0
        still_c = still_y.reshape(h // 2, 2, w // 2, 2).all(axis=(1, 3))
        y, c = got[:h], got[h:].reshape(2, h // 2, w // 2)
        assert np.array_equal(y[still_y], decoded[:h][still_y])
        assert np.array_equal(y[~still_y], converted[:h][~still_y])
        dec_c, conv_c = decoded[h:].reshape(2, h // 2, w // 2), converted[h:].reshape(2, h // 2, w // 2)
        assert np.array_equal(c[:, still_c], dec_c[:, still_c])
        assert np.array_equal(c[:, ~still_c], conv_c[:, ~still_c])


def test_scaled_output_keeps_unmasked_pixels(small_avatar) -> None:
    w, h = small_avatar.size
    comp = Compositor(small_avatar, output_size=(w // 2, h // 2))
    out = comp.compose(12, _noise_patch(1))
    assert out.shape == (h // 2, w // 2, 3)
    mask = _mask_in_frame(comp, 12)
    base = comp.base.rgb(12)
    assert np.array_equal(out[mask == 0], base[mask == 0])
    assert np.array_equal(comp.compose_i420(12, _noise_patch(1)), cv2.cvtColor(out, cv2.COLOR_RGB2YUV_I420))

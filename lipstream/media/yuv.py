"""RGB to the encoder's yuv420p in one OpenCV call (BT.601, limited range); faster than swscale here."""

from __future__ import annotations

import av
import cv2
import numpy as np

from lipstream.errors import MediaError

# FFmpeg enum values (pixfmt.h) that describe what cv2.COLOR_RGB2YUV_I420 produces: BT.601 matrix,
# limited ("tv") range. Written into the H.264 VUI so players do not guess BT.709 for HD sizes.
AVCOL_PRI_SMPTE170M = 6
AVCOL_TRC_SMPTE170M = 6
AVCOL_SPC_SMPTE170M = 6
AVCOL_RANGE_MPEG = 1


def tag_bt601(codec_context: av.VideoCodecContext) -> None:
    """Mark an encoder's output as BT.601 limited range, matching rgb_to_yuv420p."""
    codec_context.color_primaries = AVCOL_PRI_SMPTE170M
    codec_context.color_trc = AVCOL_TRC_SMPTE170M
    codec_context.colorspace = AVCOL_SPC_SMPTE170M
    codec_context.color_range = AVCOL_RANGE_MPEG


def check_rgb(rgb: np.ndarray, width: int, height: int) -> np.ndarray:
    """Return rgb as a contiguous uint8 H×W×3 array, or raise MediaError naming the mismatch."""
    if not isinstance(rgb, np.ndarray) or rgb.dtype != np.uint8 or rgb.shape != (height, width, 3):
        got = f"{getattr(rgb, 'dtype', type(rgb).__name__)} {getattr(rgb, 'shape', '')}"
        raise MediaError(f"frame must be uint8 RGB of shape ({height}, {width}, 3), got {got}")
    return np.ascontiguousarray(rgb)


def rgb_to_yuv420p(rgb: np.ndarray) -> av.VideoFrame:
    """Convert a uint8 RGB image with even sides into an av.VideoFrame in yuv420p."""
    yuv = cv2.cvtColor(rgb, cv2.COLOR_RGB2YUV_I420)
    return av.VideoFrame.from_ndarray(yuv, format="yuv420p")


def check_even_size(width: int, height: int) -> None:
    """yuv420p halves both sides for chroma, so width and height must be positive and even."""
    if width <= 0 or height <= 0 or width % 2 or height % 2:
        raise MediaError(
            f"video size must be positive and even for yuv420p, got {width}x{height}; crop or pad"
        )


def is_i420(image: np.ndarray, width: int, height: int) -> bool:
    """True when `image` is an I420 picture [(H*3/2), W] of the given size (as cv2 lays it out)."""
    shape = (height * 3 // 2, width)
    return isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.shape == shape


def to_video_frame(image: np.ndarray, width: int, height: int) -> av.VideoFrame:
    """An av.VideoFrame in yuv420p from either an RGB H×W×3 image or an I420 picture of that size."""
    if is_i420(image, width, height):
        return av.VideoFrame.from_ndarray(np.ascontiguousarray(image), format="yuv420p")
    return rgb_to_yuv420p(check_rgb(image, width, height))


def cut_i420(picture: np.ndarray, width: int, height: int, rect: tuple[int, int, int, int]) -> np.ndarray:
    """The even-aligned rectangle (x0, y0, x1, y1) of an I420 picture, as an I420 picture of its own."""
    x0, y0, x1, y1 = rect
    flat = picture.reshape(-1)
    ysize, cw, ch = width * height, width // 2, height // 2
    y = flat[:ysize].reshape(height, width)[y0:y1, x0:x1]
    u = flat[ysize : ysize + cw * ch].reshape(ch, cw)[y0 // 2 : y1 // 2, x0 // 2 : x1 // 2]
    v = flat[ysize + cw * ch :].reshape(ch, cw)[y0 // 2 : y1 // 2, x0 // 2 : x1 // 2]
    return np.concatenate([y.reshape(-1), u.reshape(-1), v.reshape(-1)]).reshape((y1 - y0) * 3 // 2, x1 - x0)


def unmasked_i420(alpha: np.ndarray) -> np.ndarray:
    """Which samples of an even-sized rectangle's I420 picture (flat, as cv2 lays it out) a mask leaves
    alone: luma where the mask is 0, chroma where all four pixels it covers are 0."""
    h, w = alpha.shape[:2]
    still = alpha == 0
    still_c = still.reshape(h // 2, 2, w // 2, 2).all(axis=(1, 3)).reshape(-1)
    return np.concatenate([still.reshape(-1), still_c, still_c])


def write_i420_rect(
    frame: np.ndarray, width: int, height: int, rect: tuple[int, int, int, int], rect_yuv: np.ndarray
) -> None:
    """Copy an even-aligned rectangle's I420 planes (flat, as cv2 lays them out) into a full picture."""
    x0, y0, x1, y1 = rect
    w, h = x1 - x0, y1 - y0
    flat = frame.reshape(-1)
    ysize, csize = width * height, (width // 2) * (height // 2)
    flat[:ysize].reshape(height, width)[y0:y1, x0:x1] = rect_yuv[: w * h].reshape(h, w)
    cw, ch = w // 2, h // 2
    u = rect_yuv[w * h : w * h + cw * ch].reshape(ch, cw)
    v = rect_yuv[w * h + cw * ch :].reshape(ch, cw)
    flat[ysize : ysize + csize].reshape(height // 2, width // 2)[y0 // 2 : y1 // 2, x0 // 2 : x1 // 2] = u
    flat[ysize + csize :].reshape(height // 2, width // 2)[y0 // 2 : y1 // 2, x0 // 2 : x1 // 2] = v

"""Eyes that blink: find a clip's own blinks, plan natural ones where the idle presenter has none, and draw
an upper lid descending over the eye.

A viewer sees the idle loop under every frame (only the mouth is redrawn), so blinks drawn into the loop's
pictures at prepare time reach every path (server stream, patch mode, the serverless page, every engine).
A photo becomes a few pictures (open, and the lid at a few heights) and a loop that plays them.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import cv2
import numpy as np

# MediaPipe face-mesh eye contours, from the outer to the inner corner: upper lid edge, lower lid edge.
RIGHT_EYE_UPPER = (33, 246, 161, 160, 159, 158, 157, 173, 133)
RIGHT_EYE_LOWER = (33, 7, 163, 144, 145, 153, 154, 155, 133)
LEFT_EYE_UPPER = (263, 466, 388, 387, 386, 385, 384, 398, 362)
LEFT_EYE_LOWER = (263, 249, 390, 373, 374, 380, 381, 382, 362)
EYES = ((RIGHT_EYE_UPPER, RIGHT_EYE_LOWER), (LEFT_EYE_UPPER, LEFT_EYE_LOWER))
# Lid pairs across each eye's opening, for openness (the middle three of each contour).
_ACROSS = tuple(tuple((up[i], low[i]) for i in (3, 4, 5)) for up, low in EYES)


@dataclass(frozen=True)
class BlinkConfig:
    """When and how the presenter blinks where the footage does not."""

    enabled: bool = True
    interval_s: tuple[float, float] = (2.0, 6.0)  # between blink starts (people: ~10-20 a minute)
    # lid down and up again: people's spontaneous blinks last ~200-350 ms (5-8 frames at 25 fps); shorter
    # ones did not read as blinks to a face mesh run over the output (issue 37: one shut frame read as none,
    # 0.22-0.32 s read under 0.55 of the eyes' openness for 4 frames; 0.28-0.34 s, shut 45 %, for 5-6)
    duration_s: tuple[float, float] = (0.28, 0.34)
    close_share: float = 0.2  # of a blink's time spent closing (the lid falls fast: under 2 frames) ...
    shut_share: float = 0.45  # ... then shut (>= 3 frame centres at 0.28 s), then up slower over the rest
    photo_loop_s: float = 12.0  # a photo's idle loop: long enough that the irregular rhythm does not show
    photo_levels: tuple[float, ...] = (0.35, 0.7, 1.0)  # lid heights a photo's pictures are drawn at
    edge_margin_s: float = 0.6  # no planned blink this near a clip stretch's ends (the loop turns there)
    meet: float = 0.78  # the closed lids meet this far down the eye's opening (the lower lid rises too)
    lid_reach: float = 0.55  # lid skin stretched over the eye: from this many eye widths above its edge
    lash: float = 0.07  # the lash line: this many eye widths of dark margin above the upper lid's edge ...
    lash_keep: float = 0.45  # ... kept at this share of its thickness when shut (a thin line, not a crescent)
    lower_skip: float = 0.1  # the rising lower lid starts this many eye widths under its edge (its wet rim
    # and the eye's white along it stay under the lid, not a bright line under the lashes)
    found_drop: float = 0.55  # a frame whose openness is below this share of the clip's median is closed
    found_max_s: float = 0.5  # ... for at most this long (longer is a squint or a look down, not a blink)

    def lid_entry(self) -> dict:
        """What the page's copy of the lid drawing and of the blink curve reads (web export's blinks.lid)."""
        return {
            "meet": self.meet, "lid_reach": self.lid_reach, "close_share": self.close_share,
            "shut_share": self.shut_share, "lash": self.lash, "lash_keep": self.lash_keep,
            "lower_skip": self.lower_skip,
        }  # fmt: skip


def eye_openness(landmarks: np.ndarray) -> float:
    """Lid opening of both eyes, averaged, over the eye widths (about 0.25-0.35 open, under 0.1 shut)."""
    values = []
    for (upper, _lower), pairs in zip(EYES, _ACROSS, strict=True):
        width = max(float(np.linalg.norm(landmarks[upper[0]] - landmarks[upper[-1]])), 1e-6)
        values.append(np.mean([np.linalg.norm(landmarks[a] - landmarks[b]) for a, b in pairs]) / width)
    return float(np.mean(values))


def find_blinks(openness: np.ndarray, fps: int, config: BlinkConfig | None = None) -> list[tuple[int, int]]:
    """The footage's own blinks: runs of frames (start, stop) whose openness dips well under the median."""
    config = config or BlinkConfig()
    values = np.asarray(openness, np.float64)
    if len(values) < 3:
        return []
    closed = values < config.found_drop * float(np.median(values))
    runs: list[tuple[int, int]] = []
    start = None
    for k, shut in enumerate([*closed.tolist(), False]):
        if shut and start is None:
            start = k
        elif not shut and start is not None:
            if k - start <= config.found_max_s * fps:
                runs.append((start, k))
            start = None
    return runs


def blink_curve(duration_frames: float, config: BlinkConfig) -> np.ndarray:
    """Lid closure 0..1 at each frame centre of one blink lasting `duration_frames`: eased down over
    `close_share` of it, shut over `shut_share`, eased up over the rest (a real blink reopens slower)."""
    n = max(2, int(np.ceil(duration_frames - 1e-9)))  # 0.28 s * 25 is 7.000000000000001 frames, not 8
    t = (np.arange(n) + 0.5) / duration_frames
    closing = np.clip(t / config.close_share, 0.0, 1.0)
    rest = max(1.0 - config.close_share - config.shut_share, 1e-6)
    opening = np.clip((1.0 - t) / rest, 0.0, 1.0)
    curve = 0.5 - 0.5 * np.cos(np.pi * np.minimum(closing, opening))
    # a blink too short for a frame centre to fall on its shut part: its nearest frame still shows it shut
    return (curve / max(float(curve.max()), 1e-6)).astype(np.float32)


def blink_starts(
    span: int, fps: int, config: BlinkConfig, rng: np.random.Generator, lead: float
) -> list[int]:
    """Irregular blink start frames in [lead·fps, span - lead·fps - longest blink): 2-6 s apart."""
    lo, hi = config.interval_s
    first = int(round(lead * fps + rng.uniform(0.0, lo) * fps))
    last = span - int(round(lead * fps)) - int(np.ceil(config.duration_s[1] * fps))
    starts = []
    k = first
    while k <= last:
        starts.append(k)
        k += int(round(rng.uniform(lo, hi) * fps))
    return starts


def plan_closure(
    span: int, fps: int, config: BlinkConfig, rng: np.random.Generator, lead: float
) -> np.ndarray:
    """Per frame of a span, the lid closure 0..1 of the planned blinks (0 between them)."""
    closure = np.zeros(span, np.float32)
    for start in blink_starts(span, fps, config, rng, lead):
        curve = blink_curve(rng.uniform(*config.duration_s) * fps, config)
        stop = min(start + len(curve), span)
        closure[start:stop] = np.maximum(closure[start:stop], curve[: stop - start])
    return closure


def count_blinks(closure: np.ndarray) -> int:
    """Blinks in a per-frame closure (or picture) sequence: the runs of non-zero frames."""
    shut = np.asarray(closure) > 0
    return int(np.count_nonzero(shut[1:] & ~shut[:-1]) + (len(shut) > 0 and shut[0]))


def rng_for(name: str) -> np.random.Generator:
    """A generator seeded by the avatar's name: preparing the same avatar again draws the same blinks."""
    return np.random.default_rng(zlib.crc32(name.encode()))


def photo_loop(config: BlinkConfig, fps: int, rng: np.random.Generator) -> tuple[np.ndarray, int]:
    """A photo's idle loop over its pictures (0: eyes open, i: photo_levels[i-1]) and its blink count.

    Blinks keep `interval_s[0] / 2` from the loop's ends, so the wrap never puts two blinks close together."""
    span = int(round(config.photo_loop_s * fps))
    closure = plan_closure(span, fps, config, rng, lead=config.interval_s[0] / 2)
    levels = np.asarray(config.photo_levels, np.float32)
    # each frame shows the drawn height nearest its closure; a frame barely closing stays open
    nearest = np.argmin(np.abs(closure[:, None] - levels[None, :]), axis=1) + 1
    loop = np.where(closure >= levels[0] / 2, nearest, 0).astype(np.int32)
    return loop, count_blinks(loop)


def still_pictures(rgb: np.ndarray, landmarks: np.ndarray, config: BlinkConfig) -> list[np.ndarray]:
    """A photo's extra pictures: its lids at each of `photo_levels`."""
    return [close_eyes(rgb, landmarks, level, config) for level in config.photo_levels]


@dataclass(frozen=True)
class IdleBlinks:
    """The idle loop as played (footage frame indices) and the lid closure drawn on each footage frame."""

    loop: np.ndarray  # int32 footage frame per loop position
    closure: np.ndarray  # float32 per footage frame: 0 as filmed, else the lid height drawn over it
    own: int  # blinks the footage shows by itself within the loop
    drawn: int  # blinks drawn per pass of the loop
    seconds: float  # one pass of the loop
    drawing: bool = True  # lipstream draws this avatar's blinks (False: the footage's own, or blinks off)

    def draw(self, rgb: np.ndarray, frame: int, landmarks: np.ndarray, config: BlinkConfig) -> np.ndarray:
        """Footage frame `frame` as the loop shows it: its planned lid drawn, or as it was."""
        amount = float(self.closure[frame])
        return close_eyes(rgb, landmarks[frame], amount, config) if amount > 0 else rgb

    def entry(self) -> dict:
        """What manifest.json records under idle.blinks."""
        per_minute = 60.0 * (self.own + self.drawn) / max(self.seconds, 1e-6)
        entry = {"own": self.own, "drawn": self.drawn, "per_minute": round(per_minute, 1)}
        if self.drawing:  # where the drawn ones begin in the loop: blinks decided while speaking keep clear
            shut = self.closure[self.loop] > 0
            entry["starts"] = np.flatnonzero(shut & ~np.roll(shut, 1)).tolist()
        return entry


def plan_idle_blinks(
    stretch_loop: np.ndarray,
    landmarks: np.ndarray,
    source_frames: int,
    is_still: bool,
    fps: int,
    config: BlinkConfig,
    name: str,
) -> IdleBlinks:
    """Blinks for the idle loop: a photo's pictures played in an irregular rhythm; a clip's stretch kept as
    filmed when it blinks by itself, else with blinks drawn on some of its frames (each shows twice per
    loop, going forward and coming back)."""
    frames = len(landmarks)
    closure = np.zeros(frames, np.float32)
    loop = np.asarray(stretch_loop, np.int32)
    if is_still:
        if not config.enabled or frames == source_frames:
            return IdleBlinks(loop, closure, 0, 0, len(loop) / fps, drawing=False)
        closure[source_frames:] = config.photo_levels[: frames - source_frames]
        played, count = photo_loop(config, fps, rng_for(name))
        # picture 0 of photo_loop is the photo (the last source frame), i its i-th lid height
        loop = np.where(played > 0, source_frames - 1 + played, source_frames - 1).astype(np.int32)
        return IdleBlinks(loop, closure, 0, count, len(loop) / fps)
    start, stop = int(loop.min()), int(loop.max()) + 1
    openness = np.array([eye_openness(landmarks[k]) for k in range(start, stop)])
    own = find_blinks(openness, fps, config)
    seconds = len(loop) / fps
    passes = 2 if len(loop) > stop - start else 1  # a ping-pong loop shows each stretch frame twice
    if own or not config.enabled:
        return IdleBlinks(loop, closure, passes * len(own), 0, seconds, drawing=False)
    planned = plan_closure(stop - start, fps, config, rng_for(name), lead=config.edge_margin_s)
    closure[start:stop] = planned
    return IdleBlinks(loop, closure, 0, passes * count_blinks(planned), seconds)


def close_eyes(rgb: np.ndarray, landmarks: np.ndarray, closure: float, config: BlinkConfig | None = None
               ) -> np.ndarray:  # fmt: skip
    """The picture with both upper lids lowered by `closure` (0 open .. 1 shut); landmarks in its pixels.

    The lid is the picture's own: the skin between the brow and the lash line is stretched down so the
    lash line lands on the new edge, and the lower lid rises to meet it; below the new edge the eye shows
    as it was (covered from the top, as a lid covers it), so nothing is smeared and no hole opens."""
    config = config or BlinkConfig()
    out = np.array(rgb, copy=True)
    if closure <= 1e-3:
        return out
    for upper_ids, lower_ids in EYES:
        _lower_lid(out, rgb, landmarks[list(upper_ids)], landmarks[list(lower_ids)], float(closure), config)
    return out


def _lower_lid(out: np.ndarray, rgb: np.ndarray, upper: np.ndarray, lower: np.ndarray, closure: float,
               config: BlinkConfig) -> None:  # fmt: skip
    height, width = rgb.shape[:2]
    eye_w = float(np.linalg.norm(upper[0] - upper[-1]))
    if eye_w < 4.0:
        return
    reach = config.lid_reach * eye_w
    x0 = max(int(np.floor(min(upper[:, 0].min(), lower[:, 0].min()) - 0.25 * eye_w)), 0)
    x1 = min(int(np.ceil(max(upper[:, 0].max(), lower[:, 0].max()) + 0.25 * eye_w)) + 1, width)
    y0 = max(int(np.floor(upper[:, 1].min() - reach)) - 1, 0)
    y1 = min(int(np.ceil(lower[:, 1].max() + 0.5 * reach)) + 1, height)
    if x1 - x0 < 4 or y1 - y0 < 4:
        return
    xs = np.arange(x0, x1, dtype=np.float32)
    ys = np.arange(y0, y1, dtype=np.float32)[:, None]
    top_edge = _row_at(upper, xs)[None, :]
    low_edge = np.maximum(_row_at(lower, xs)[None, :], top_edge)
    # Outside the corners the lids do not move; the displacement eases to zero just past them.
    left, right = float(min(upper[0, 0], upper[-1, 0])), float(max(upper[0, 0], upper[-1, 0]))
    beyond = np.maximum(np.maximum(left - xs, xs - right), 0.0) / (0.2 * eye_w)
    taper = np.clip(1.0 - beyond, 0.0, 1.0)[None, :]
    gap = (low_edge - top_edge) * taper
    meet = top_edge + config.meet * gap
    new_top = top_edge + closure * (meet - top_edge)
    new_low = low_edge - closure * (low_edge - meet) * taper
    lid_top = top_edge - reach
    below_reach = low_edge + 0.5 * reach
    # The lid's skin (lid_top .. the lash band) stretches over the eye; the lash band above the edge (dark
    # lashes, liner) thins as it goes down, so the shut lid shows skin with a thin lash line at the meeting
    # line, not the band stretched into a dark crescent.
    # (outside the corners it fades with the taper, as every displacement does)
    lash = np.float32(config.lash * eye_w)
    lash_out = lash * (1.0 - np.float32(closure * (1.0 - config.lash_keep)) * taper)
    skin_src = top_edge - lash
    skin_dst = new_top - lash_out
    # Backward map: where each output pixel takes its colour from.
    over_skin = (ys >= lid_top) & (ys < skin_dst)
    src_skin = lid_top + (ys - lid_top) * (skin_src - lid_top) / np.maximum(skin_dst - lid_top, 1e-3)
    over_lash = (ys >= skin_dst) & (ys <= new_top)
    src_lash = skin_src + (ys - skin_dst) * lash / np.maximum(lash_out, 1e-3)
    low_src = low_edge + np.float32(closure * config.lower_skip * eye_w) * taper
    under_lid = (ys >= new_low) & (ys <= below_reach)
    src_lower = low_src + (ys - new_low) * (below_reach - low_src) / np.maximum(below_reach - new_low, 1e-3)
    map_y = np.where(
        over_skin, src_skin, np.where(over_lash, src_lash, np.where(under_lid, src_lower, ys))
    ).astype(np.float32)
    map_x = np.broadcast_to(xs[None, :], map_y.shape).astype(np.float32)
    # the maps hold whole-picture coordinates, so remap returns just the region
    out[y0:y1, x0:x1] = cv2.remap(rgb, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)


def _row_at(contour: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """The contour's row at columns xs (held flat past its ends)."""
    order = np.argsort(contour[:, 0])
    return np.interp(xs, contour[order, 0], contour[order, 1]).astype(np.float32)

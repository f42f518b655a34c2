"""The page's blinks at phrase ends (lipstream/web/edge/lids.js) against Python's: the same decisions frame by
frame (phrase_blinks.PhraseEndBlinks), the same blink curve, and lids drawn like blink.close_eyes."""

from __future__ import annotations

import base64
from types import SimpleNamespace

import cv2
import numpy as np
from js_parity import run_node

from lipstream.avatar.blink import EYES, BlinkConfig, blink_curve, close_eyes
from lipstream.avatar.phrase_blinks import PhraseBlinkConfig, PhraseEndBlinks, phrase_chance
from lipstream.render.eyelids import EyeLids

FPS = 25
EYE_IDS = [i for pair in EYES for contour in pair for i in contour]
# cv2.remap's INTER_LINEAR rounds the map to 1/32 px and weighs with integers; lids.js does the same
# arithmetic on the same float32 map, so the pixels measured equal (0 levels on every picture here). 1 level
# is allowed for a map value landing on the other side of a 1/32 px rounding step (the eye width's float32
# norm may differ by an ulp from BLAS's on another machine), and only on a few pixels.
LEVELS = 1


def _lid(config: BlinkConfig) -> dict:
    return config.lid_entry()  # what export.json's blinks.lid carries


def _phrases(count: int, voiced_s: float, pause_s: float) -> list[bool]:
    one = [True] * int(voiced_s * FPS) + [False] * int(pause_s * FPS)
    return one * count


def _random_voicing(rng: np.random.Generator, frames: int) -> list[bool]:
    """Runs of voice and silence of random lengths (short bursts, long phrases, short and long pauses)."""
    out: list[bool] = []
    voiced = bool(rng.integers(0, 2))
    while len(out) < frames:
        out += [voiced] * int(rng.integers(1, 60))
        voiced = not voiced
    return out[:frames]


def _cases() -> list[dict]:
    """Machines and the frames they are stepped through: [frame, voiced, loop position]."""
    rng = np.random.default_rng(22)
    fast = PhraseBlinkConfig(chance=1.0, gap_s=0.5)
    cases = []

    def case(voicing, config=None, loop=300, drawn=(72, 186), first=0, at0=0, frames=None):
        config = config or PhraseBlinkConfig()
        frames = frames if frames is not None else list(range(first, first + len(voicing)))
        steps = [[f, bool(v), (at0 + f) % loop] for f, v in zip(frames, voicing, strict=True)]
        cases.append({"config": config, "loop": loop, "drawn": list(drawn), "steps": steps})

    case(_phrases(6, 1.5, 0.7))
    case(_phrases(6, 1.5, 0.7), fast)
    case(_phrases(8, 0.7, 0.3), fast)  # phrases too short to count
    case(_phrases(5, 2.0, 0.19), fast)  # pauses too short to confirm
    for seed_case in range(6):
        voicing = _random_voicing(rng, 1500)
        config = fast if seed_case % 2 else PhraseBlinkConfig()
        case(voicing, config, first=int(rng.integers(0, 10_000)), at0=int(rng.integers(0, 300)))
    # the loop's drawn blinks just before and after the wrap: the gap is measured across it
    case(_phrases(10, 1.2, 0.5), fast, loop=100, drawn=(2, 97), at0=60)
    case(_phrases(10, 1.2, 0.5), fast, loop=100, drawn=(99,), at0=0)
    case(_phrases(10, 1.2, 0.5), PhraseBlinkConfig(gap_s=0.3), loop=37, drawn=(0, 36), at0=5)
    # a timeline jump (an interrupt moved it): back by 40 frames mid-blink, forward by 100
    voicing = _phrases(4, 1.0, 0.4) * 3
    n = len(voicing)
    third = n // 3
    back, ahead = range(third - 40, 2 * third - 40), range(2 * third + 60, n + 60)
    frames = [*range(third), *back, *ahead]
    case(voicing, fast, frames=frames)
    case(voicing, PhraseBlinkConfig(), frames=[f + 3_000_000_000 for f in frames])  # frames past 2^31
    return cases


def test_the_page_machine_blinks_on_the_same_frames_as_python() -> None:
    lid = BlinkConfig()
    cases = _cases()
    request = {"machines": [
        {"loopLength": c["loop"], "drawnStarts": c["drawn"], "fps": FPS, "phrase": c["config"].entry(),
         "lid": _lid(lid), "steps": c["steps"]} for c in cases
    ]}  # fmt: skip
    js = run_node("lids_parity.mjs", request)
    blinks = 0
    for c, closures, starts in zip(cases, js["machines"], js["starts"], strict=True):
        machine = PhraseEndBlinks(c["loop"], c["drawn"], FPS, c["config"], lid)
        want, want_starts = [], []
        for frame, voiced, position in c["steps"]:
            want.append(machine.step(frame, voiced, position))
            if machine.started == frame:
                want_starts.append(frame)
        assert closures == want  # float32 curve values: equal as doubles
        assert starts == want_starts
        blinks += len(want_starts)
    assert blinks > 30  # the cases do blink (and some do not: the short phrases, the short pauses)


def test_the_hash_and_the_curve_are_python_s_bit_for_bit() -> None:
    frames = [0, 1, 2, 25, 999, 2**31 - 1, 2**31, 2**32 - 1, 2**32 + 5, 3_000_000_123, 10**12 + 7, 2**53 - 1]
    frames += np.random.default_rng(5).integers(0, 2**40, 200).tolist()
    durations = (4.0, 0.16 * FPS, 0.28 * FPS, 0.22 * FPS, 0.32 * FPS, 2.5, 3.7, 6.25, 1.0)
    shapes = ((0.4, 0.0), (0.3, 0.0), (0.25, 0.3), (0.2, 0.4))  # (close_share, shut_share)
    curves = [{"durationFrames": d, "closeShare": c, "shutShare": s} for d in durations for c, s in shapes]
    request = {"chances": frames, "curves": curves}
    js = run_node("lids_parity.mjs", request)
    assert js["chances"] == [phrase_chance(f) for f in frames]
    for entry, got in zip(request["curves"], js["curves"], strict=True):
        config = BlinkConfig(close_share=entry["closeShare"], shut_share=entry["shutShare"])
        want = blink_curve(entry["durationFrames"], config)
        assert np.array_equal(np.asarray(got, np.float32), want), (entry, got, want.tolist())


def _rgba(rgb: np.ndarray) -> str:
    alpha = np.full(rgb.shape[:2] + (1,), 255, np.uint8)
    return base64.b64encode(np.concatenate([rgb, alpha], axis=2).tobytes()).decode()


def _eye_points(landmarks: np.ndarray) -> list[float]:
    """What export.json's `eyes` row holds for a frame (unrounded here: the float32 values Python reads)."""
    return landmarks[EYE_IDS].reshape(-1).astype(np.float64).tolist()


def test_lids_drawn_on_the_page_match_python_on_a_real_face(astronaut) -> None:
    rgb, landmarks = astronaut
    config = BlinkConfig()
    height, width = rgb.shape[:2]
    # the whole picture (close_eyes), and the eyes' rectangle with the points shifted into it (what the page's
    # compositor cuts from the video, as render/eyelids.EyeLids does on the server)
    lids = EyeLids(SimpleNamespace(landmarks=[landmarks]), 1.0, (width, height), config)
    x0, y0, x1, y1 = lids.rect(0)
    region = np.ascontiguousarray(rgb[y0:y1, x0:x1])
    shifted = landmarks - np.array([x0, y0], np.float32)
    closures = (0.5, 1.0, 0.23)
    jobs = [(rgb, landmarks, c) for c in closures] + [(region, shifted, c) for c in closures]
    # a face 2.5x as large (the astronaut's eyes are ~30 px wide; a 1080p presenter's ~80 px)
    big = cv2.resize(rgb, None, fx=2.5, fy=2.5, interpolation=cv2.INTER_CUBIC)
    jobs += [(big, landmarks * np.float32(2.5), c) for c in (0.5, 1.0)]
    request = {
        "close": [{"width": int(img.shape[1]), "height": int(img.shape[0]), "rgba": _rgba(img),
                   "points": _eye_points(lm), "closure": c, "lid": _lid(config)} for img, lm, c in jobs],
        "rects": [{"points": _eye_points(landmarks), "lid": _lid(config), "width": width, "height": height}],
    }  # fmt: skip
    js = run_node("lids_parity.mjs", request, timeout=120)
    assert js["rects"] == [[x0, y0, x1, y1]]
    for (img, lm, closure), got64 in zip(jobs, js["close"], strict=True):
        got = np.frombuffer(base64.b64decode(got64), np.uint8).reshape(img.shape[0], img.shape[1], 4)
        assert (got[..., 3] == 255).all()
        got = got[..., :3]
        want = close_eyes(img, lm, closure, config)
        diff = np.abs(got.astype(int) - want.astype(int))
        moved = np.any(want != img, axis=2)
        assert moved.sum() > 200, closure  # the lids did move
        differ = int(np.count_nonzero(diff))
        print(f"closure {closure} on {img.shape[1]}x{img.shape[0]}: {int(moved.sum())} pixels moved, "
              f"max |JS - Python| {int(diff.max())}, {differ} channel values differ")  # fmt: skip
        assert diff.max() <= LEVELS, (closure, int(diff.max()))
        assert np.count_nonzero(diff) <= 0.01 * moved.sum()
        # far from the eyes the picture is untouched (identical pixels, not merely close)
        near = np.zeros(img.shape[:2], bool)
        eyes = lm[EYE_IDS]
        eye_w = float(np.linalg.norm(lm[33] - lm[133]))
        near[max(int(eyes[:, 1].min() - eye_w), 0) : int(eyes[:, 1].max() + eye_w),
             max(int(eyes[:, 0].min() - eye_w), 0) : int(eyes[:, 0].max() + eye_w)] = True  # fmt: skip
        assert np.array_equal(got[~near], img[~near])

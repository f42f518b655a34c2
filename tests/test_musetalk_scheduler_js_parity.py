"""The MuseTalk page engine's patch scheduler (lipstream/web/edge/musetalk/scheduler.js, with planner.js,
codebook.js and pixels.js) against lipstream/render/accel.py's PatchScheduler, run in Node.

Both sides get the same feature rows (a few recurring "mouth shapes" plus noise, some fast-changing runs),
skip masks with silences and isolated speech, source frame ids from an idle loop, pushed in uneven chunks
(one empty) and finished, for two utterances on one scheduler (the calibrated threshold and the codebook
carry over). A stand-in engine, the same in Python and JS, makes each neural patch from an FNV-1a hash of
the feature row's float32 bytes and the source frame, so no ONNX is needed. Compared step by step: the
planner's decisions (kind, neighbours, cross-fade weight), the frames released (order, source frame, kind,
keyframe / codebook hit / infill / silent), the engine calls, the patch pixels (copies exact, cross-fades
within one grey level; the page zeroes pixels outside the mouth mask and puts the mask in the alpha lane),
the stats counters, and at the end the codebook's entries and counters."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from js_parity import run_node

from lipstream.render.accel import AccelConfig, PatchScheduler, speaking_mask
from lipstream.render.planner import INFILL, KEYFRAME, SILENT

DIM = 32  # >= accel.LOW_DIM: hashed as is, like MuseTalk's Whisper windows
PATCH = 8
LOOP = 23  # idle loop length: source frames repeat
STATS = {  # AccelStats field -> the page's stats key
    "frames": "frames",
    "silent_frames": "silentFrames",
    "keyframes": "keyframes",
    "codebook_hits": "codebookHits",
    "neural_frames": "neuralFrames",
    "infill_frames": "infillFrames",
}


def seed_of(row: np.ndarray, source: int) -> int:
    """FNV-1a (32 bit) of the row's float32 bytes, mixed with the source frame (as seedOf in the .mjs)."""
    h = 0x811C9DC5
    for b in np.asarray(row, "<f4").tobytes():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h ^ ((source * 0x9E3779B1) & 0xFFFFFFFF)


def stand_in_patch(row: np.ndarray, source: int) -> np.ndarray:
    """The stand-in engine's RGB patch: bytes of a 32-bit LCG seeded by seed_of."""
    h = seed_of(row, source)
    values = np.empty(PATCH * PATCH * 3, np.uint8)
    for k in range(values.size):
        h = (h * 1664525 + 1013904223) & 0xFFFFFFFF
        values[k] = h >> 24
    return values.reshape(PATCH, PATCH, 3)


def mask_of(source: int) -> np.ndarray:
    """The stand-in mouth mask of a source frame (maskOf in the .mjs): some zeros, the rest 1..255."""
    p = np.arange(PATCH * PATCH)
    return np.where((p * 7 + source * 13) % 5 == 0, 0, (p * 31 + source * 17) % 255 + 1).astype(np.uint8)


class StandInEngine:
    """Just what PatchScheduler uses of an engine; records (seed, source frame) of every rendered row."""

    name = "stand-in"
    feature_dim = DIM
    patch_size = PATCH
    batch_size = 3  # Python splits engine passes in batches, the page does not: compared flattened
    accelerate_by_default = True
    cache_key = ""

    def __init__(self) -> None:
        """No calls yet."""
        self.calls: list[list[int]] = []

    def render(self, bundle: Any, features: np.ndarray, base_ids: np.ndarray) -> list[np.ndarray]:
        """One patch per row."""
        self.calls.extend([seed_of(f, int(b)), int(b)] for f, b in zip(features, base_ids, strict=True))
        return [stand_in_patch(f, int(b)) for f, b in zip(features, base_ids, strict=True)]


def utterance(rng: np.random.Generator, n: int, silences: list[tuple[int, int]], protos: np.ndarray):
    """Feature rows (segments of recurring shapes with small noise, some fast-changing) and the skip mask."""
    rows = []
    while len(rows) < n:
        length = int(rng.integers(2, 9))
        if rng.random() < 0.25:  # fast change: every frame a new point
            rows.extend(rng.normal(size=(length, DIM)))
        else:
            shape = protos[rng.integers(len(protos))]
            rows.extend(shape + 0.01 * rng.normal(size=(length, DIM)))
    silent = np.zeros(n, bool)
    for a, b in silences:
        silent[a:b] = True
    return np.asarray(rows[:n], np.float32), ~speaking_mask(silent)


def make_steps(seed: int) -> list[dict[str, Any]]:
    """Two utterances, pushed in uneven chunks (one empty), each followed by finish."""
    rng = np.random.default_rng(seed)
    protos = rng.normal(size=(5, DIM))
    plans = [  # (frames, silences, chunk ends, loop offset)
        (110, [(0, 6), (38, 44), (45, 58), (74, 76), (96, 110)], [7, 7, 50, 51, 110], 5),
        (45, [(20, 27)], [17, 45], 11),
    ]
    steps: list[dict[str, Any]] = []
    for n, silences, ends, offset in plans:
        feats, skip = utterance(rng, n, silences, protos)
        ids = (offset + np.arange(n)) % LOOP
        start = 0
        for end in ends:
            steps.append({"op": "push", "features": feats[start:end], "skip": skip[start:end],
                          "ids": ids[start:end], "first": start})  # fmt: skip
            start = end
        steps.append({"op": "finish"})
    return steps


def run_python(steps: list[dict[str, Any]], codebook: bool) -> tuple[PatchScheduler, list[dict[str, Any]]]:
    """Drive accel.PatchScheduler; per step: released (index, patch), plan rows, engine rows, stats."""
    engine = StandInEngine()
    config = AccelConfig(enabled=True, codebook=codebook, codebook_entries=6, seed=3)
    scheduler = PatchScheduler(None, engine, config)  # type: ignore[arg-type]
    out = []
    for step in steps:
        planner, rows = scheduler.planner, []

        def recorded(fn, rows=rows):
            def call(*args):
                plan = fn(*args)
                rows.extend(zip(plan.index.tolist(), plan.kind.tolist(), plan.left.tolist(),
                                plan.right.tolist(), plan.weight.tolist(), strict=True))  # fmt: skip
                return plan

            return call

        # the class's methods, bound afresh each step (the planner object lives until finish)
        planner.plan = recorded(type(planner).plan.__get__(planner))
        planner.finish = recorded(type(planner).finish.__get__(planner))
        engine.calls = []
        if step["op"] == "push":
            n = len(step["ids"])
            payloads = [step["first"] + i for i in range(n)]
            released = scheduler.push(step["features"], step["skip"], step["ids"], payloads)
        else:
            released = scheduler.finish()
        out.append({"released": released, "plan": rows, "renders": engine.calls,
                    "stats": dict(scheduler.stats.as_dict())})  # fmt: skip
    return scheduler, out


def to_request(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps as JSON for the .mjs."""
    return [
        {"op": "push", "features": s["features"].reshape(-1).tolist(), "skip": s["skip"].astype(int).tolist(),
         "ids": s["ids"].tolist()} if s["op"] == "push" else {"op": "finish"}
        for s in steps
    ]  # fmt: skip


def labels(plan: list, released: list[int], frames: dict[int, tuple[int, int]], renders: list) -> list[str]:
    """Each released frame as a word: silent, neural (rendered now), hit (codebook), infill@weight."""
    rendered = {tuple(r) for r in renders}
    decided = {int(r[0]): r for r in plan}
    words = []
    for index in released:
        _, kind, _, _, weight = decided[index]
        if kind == SILENT:
            words.append("silent")
        elif kind == KEYFRAME:
            words.append("neural" if frames[index] in rendered else "hit")
        else:
            words.append(f"infill@{weight:.4f}")
    return words


@pytest.mark.parametrize("codebook,masks", [(True, True), (False, False)], ids=["codebook+masks", "plain"])
def test_scheduler_matches_python(codebook: bool, masks: bool) -> None:
    """Same inputs, same stand-in engine: same decisions, releases, engine calls, pixels and stats."""
    steps = make_steps(7)
    py_sched, py = run_python(steps, codebook)
    scenario: dict[str, Any] = {"dim": DIM, "patchSize": PATCH, "masks": masks, "steps": to_request(steps),
                                "codebook": None}  # fmt: skip
    if codebook:
        book = py_sched.codebook
        assert book is not None and book.dim == DIM  # no lift: the page hashes the rows as they are
        scenario["codebook"] = {"hyperplanes": book.hyperplanes.reshape(-1).tolist(), "bits": book.bits,
                                "maxEntries": book.max_entries, "threshold": book.threshold}  # fmt: skip
    js = run_node("musetalk_scheduler_parity.mjs", {"scenarios": [scenario]})["scenarios"][0]

    frames: dict[int, tuple[int, int]] = {}  # index in the utterance -> (stand-in seed, source frame)
    words: list[str] = []
    for k, (step, want, have) in enumerate(zip(steps, py, js["steps"], strict=True)):
        where = f"step {k} ({step['op']})"
        if step["op"] == "push":
            for i, (row, source) in enumerate(zip(step["features"], step["ids"], strict=True)):
                frames[step["first"] + i] = (seed_of(row, int(source)), int(source))
        # the planner's decisions (kind, left and right neighbours; weight to float32 precision)
        assert [r[:4] for r in have["plan"]] == [list(r[:4]) for r in want["plan"]], where
        np.testing.assert_allclose([r[4] for r in have["plan"]], [r[4] for r in want["plan"]], atol=1e-6)
        # engine rows, in order (Python splits them in batches of engine.batch_size, the page does not)
        assert [row for call in have["renders"] for row in call] == want["renders"], where
        # released frames: order, source frame, kind, where the patch came from
        order = [int(p) for p, _ in want["released"]]
        assert [r["index"] for r in have["released"]] == order, where
        assert [r["sourceFrame"] for r in have["released"]] == [frames[i][1] for i in order], where
        py_words = labels(want["plan"], order, frames, want["renders"])
        flat_js = [row for call in have["renders"] for row in call]
        assert labels(have["plan"], order, frames, flat_js) == py_words, where
        words += py_words
        decided = {int(r[0]): r for r in want["plan"]}
        for (index, patch), got in zip(want["released"], have["released"], strict=True):
            _, kind, left, right, _ = decided[index]
            assert got["kind"] == kind, (where, index)
            if kind == SILENT:
                assert patch is None and got["patch"] is None, (where, index)
                continue
            rgba = np.asarray(got["patch"], np.uint32).view(np.uint8).reshape(PATCH, PATCH, 4)
            alpha = mask_of(got["sourceFrame"]) if masks else np.full(PATCH * PATCH, 255, np.uint8)
            np.testing.assert_array_equal(rgba[..., 3].reshape(-1), alpha, err_msg=f"{where} alpha {index}")
            if kind == KEYFRAME:  # a copy (engine or codebook): exact
                np.testing.assert_array_equal(rgba[..., :3], patch, err_msg=f"{where} keyframe {index}")
                continue
            assert kind == INFILL and left < index < right
            shown = alpha.reshape(PATCH, PATCH) > 0
            diff = np.abs(rgba[..., :3].astype(int) - patch.astype(int))
            assert diff[shown].max(initial=0) <= 1, (where, index, int(diff[shown].max()))
            assert (rgba[~shown] == 0).all(), (where, index)  # outside the mask: 0 on the page (never drawn)
        # counters after every step
        assert {STATS[key]: v for key, v in want["stats"].items()} == have["stats"], where

    # the inputs exercise every path
    kinds = {w.split("@")[0] for w in words}
    assert kinds == {"silent", "neural", "infill"} | ({"hit"} if codebook else set()), kinds
    assert {w for w in words if w.startswith("infill")} >= {"infill@0.5000", "infill@0.2500"}  # fast and slow
    if codebook:
        book = py_sched.codebook
        assert book is not None and book.evictions > 0
        codes = [[int(c) & 0xFFFFFFFF, int(c) >> 32] for c in book.codes[: book.size]]
        counters = {"size": book.size, "hits": book.hits, "misses": book.misses, "evictions": book.evictions}
        assert js["codebook"] == {**counters, "codes": codes}

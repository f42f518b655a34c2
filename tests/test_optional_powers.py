"""Optional powers are declared Protocols asked for with isinstance (engines/base.py, talk/models/llm.py,
talk/turn_end.py), and the batched engine's wrappers declare Engine and forward it member by member."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from lipstream.avatar.bundle import AvatarBundle
from lipstream.avatar.face_client import FaceWorker, StartsInBackground
from lipstream.avatar.face_worker import MediapipeFaceModels
from lipstream.avatar.tracking import FaceTracker
from lipstream.engines.base import BatchesAcrossSessions, DescribesMouth, Engine, ReportsStatus, Speech
from lipstream.engines.batched import BatchedEngine, SessionEngine
from lipstream.engines.batcher import BatchConfig
from lipstream.engines.musetalk.engine import MuseTalkEngine
from lipstream.engines.viseme.engine import VisemeEngine
from lipstream.talk.models.llm import ReportsProcess
from lipstream.talk.models.llm_embedded import EmbeddedChatModel
from lipstream.talk.models.llm_openai import OpenAIChatModel, ReadingAheadChatModel
from lipstream.talk.turn_end import EndOfTurnModel

PACKAGE = Path(__file__).resolve().parent.parent / "lipstream"
POWERS = (
    "pass_inputs", "pass_runner", "finish_patches", "status", "mouth_source", "end_of_turn", "model_status",
    "turn_status", "knowledge_status", "ready", "release",
)  # fmt: skip
SIZES = ("name", "feature_kind", "feature_dim", "patch_size", "batch_size", "lookahead_frames")


class TinyBatchable(Engine):
    """A numpy engine with the batching power: each patch is its feature row's first value, everywhere."""

    name = "tiny"
    feature_kind = "tiny"
    feature_dim = 2
    patch_size = 4
    batch_size = 2
    lookahead_frames = 1
    accelerate_by_default = False
    cache_key = "v1"

    def __init__(self) -> None:
        self.prepared: list[object] = []

    def prepare(self, bundle: AvatarBundle) -> None:
        self.prepared.append(bundle)

    def features(self, speech: Speech) -> np.ndarray:
        return np.zeros((speech.frame_count, self.feature_dim), np.float32)

    def render(self, bundle: AvatarBundle, features: np.ndarray, frame_ids: np.ndarray) -> np.ndarray:
        latents, audio = self.pass_inputs(bundle, features, frame_ids)
        return self.finish_patches(bundle, frame_ids, self.pass_runner(len(latents))(latents, audio))

    def pass_inputs(self, bundle: AvatarBundle, features: np.ndarray, frame_ids: np.ndarray) -> tuple:
        return np.asarray(features, np.float32), np.asarray(features, np.float32)

    def pass_runner(self, size: int) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        return lambda latents, _audio: np.broadcast_to(
            latents[:, :1, None, None].astype(np.uint8), (len(latents), 4, 4, 3)
        ).copy()

    def finish_patches(self, bundle: AvatarBundle, frame_ids: np.ndarray, out: np.ndarray) -> np.ndarray:
        return out


def test_the_engines_declare_the_powers_they_have() -> None:
    viseme = VisemeEngine()
    muse = object.__new__(MuseTalkEngine)  # the powers are its methods: none of its weights are needed
    assert isinstance(viseme, DescribesMouth) and isinstance(muse, BatchesAcrossSessions)
    assert not isinstance(viseme, BatchesAcrossSessions) and not isinstance(muse, DescribesMouth)
    assert not isinstance(viseme, ReportsStatus) and not isinstance(muse, ReportsStatus)


def test_the_language_models_declare_theirs() -> None:
    embedded = object.__new__(EmbeddedChatModel)  # no process started
    assert isinstance(embedded, EndOfTurnModel) and isinstance(embedded, ReportsProcess)
    for cls in (OpenAIChatModel, ReadingAheadChatModel):  # an endpoint judges no turns and has no process
        endpoint = object.__new__(cls)
        assert not isinstance(endpoint, EndOfTurnModel) and not isinstance(endpoint, ReportsProcess)


def test_face_models_that_may_still_be_starting_say_so() -> None:
    for cls in (FaceWorker, MediapipeFaceModels):  # no process started, no mediapipe imported
        assert isinstance(object.__new__(cls), StartsInBackground)

    class Starting:
        def ready(self) -> bool:
            return False

    assert not FaceTracker(models=Starting()).ready()
    assert FaceTracker(models=object()).ready()  # models that cannot tell are taken as ready


def test_the_batched_engine_is_an_engine_that_forwards_each_member() -> None:
    inner = TinyBatchable()
    batched = BatchedEngine(inner, BatchConfig(batch_sizes=(2, 4), max_wait_ms=1))
    try:
        view = batched.for_session(time.perf_counter)
        assert isinstance(view, SessionEngine) and view.for_session(time.perf_counter) is view
        for wrapper in (batched, view):
            assert isinstance(wrapper, Engine) and Engine in type(wrapper).__mro__
            for name in SIZES:
                assert getattr(wrapper, name) == getattr(inner, name), name
            assert wrapper.accelerate_by_default is False and wrapper.cache_key == "v1"
            wrapper.prepare("bundle")
            assert wrapper.features(Speech(np.zeros(16000, np.float32))).shape == (25, 2)
            assert wrapper.stack_inputs([np.ones((1, 2)), np.ones((2, 2))]).shape == (3, 2)
            rows = np.ones((3, 2), np.float32)
            assert wrapper.onset(rows, 0) is rows and wrapper.release(rows[-1]).shape == (0, 2)
            with pytest.raises(AttributeError):  # no __getattr__: only the contract goes through
                _ = wrapper.pass_runner
        assert inner.prepared == ["bundle", "bundle"]
        patches = view.render(None, np.array([[7, 0], [9, 0]], np.float32), np.array([0, 1]))
        assert patches.shape == (2, 4, 4, 3) and patches[1].max() == 9
        assert isinstance(batched, ReportsStatus) and batched.status()["batch_sizes"] == [2, 4]
        assert not isinstance(view, ReportsStatus)
    finally:
        batched.close()


def test_an_engine_without_the_power_is_refused() -> None:
    with pytest.raises(TypeError, match="cannot batch"):
        BatchedEngine(VisemeEngine())


def test_no_wrapper_looks_members_up_by_name() -> None:
    assert "__getattr__" not in vars(BatchedEngine) and "__getattr__" not in vars(SessionEngine)


def test_nothing_probes_for_an_optional_power() -> None:
    old = 'hasattr(engine, "status")\nhasattr(llm, "end_of_turn")\ngetattr(self.llm, "status", None)'
    probe = re.compile(r"(getattr|hasattr)\([^,()]+,\s*[\"'](" + "|".join(POWERS) + r")[\"']")
    assert len(probe.findall(old)) == 3  # the probe finds what it replaced
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{n}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if probe.search(line)
    ]
    assert found == [], f"declare the power as a Protocol and ask with isinstance: {found}"

"""MuseTalk v1.0 follows upstream v1.0: no jaw margin in its crop, Whisper's pre-LayerNorm last state."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("diffusers")

from lipstream.avatar.bundle import load_avatar  # noqa: E402
from lipstream.engines.musetalk.latents import crop_face, to_bundle_crop, version_box  # noqa: E402
from lipstream.engines.musetalk.topology import write_model_folder  # noqa: E402
from lipstream.engines.registry import create_engine  # noqa: E402


def test_version_box_drops_the_jaw_margin_for_v10_only() -> None:
    box = np.array([100, 200, 300, 420])
    assert version_box(box, "1.5").tolist() == [100, 200, 300, 420]
    assert version_box(box, "1.0").tolist() == [100, 200, 300, 410]
    assert version_box(box, "1.0", margin=22.4).tolist() == [100, 200, 300, 398]  # a large face's margin
    assert version_box(box, "1.5", margin=22.4).tolist() == [100, 200, 300, 420]


def test_a_v10_patch_fills_the_rows_above_the_margin_and_keeps_the_frame_below() -> None:
    frame = np.random.default_rng(1).integers(0, 256, (600, 400, 3), dtype=np.uint8)
    box = np.array([100, 100, 300, 356])  # 256 rows tall: the 10 px margin is 10 crop rows
    patch = np.full((256, 256, 3), 7, np.uint8)
    out = to_bundle_crop(patch, frame, box, "1.0")
    assert np.all(out[:246] == 7)
    np.testing.assert_array_equal(out[246:], crop_face(frame, box)[246:])
    assert to_bundle_crop(patch, frame, box, "1.5") is patch


@pytest.mark.slow  # builds and runs the tiny v1.0 models, 10-12 s
def test_v10_engine_encodes_its_own_crop_and_renders_in_the_bundle_crop(
    small_avatar, tmp_path_factory: pytest.TempPathFactory
) -> None:
    models = write_model_folder(tmp_path_factory.mktemp("models"), versions=("1.0",))
    bundle = load_avatar(shutil.copytree(small_avatar.path, tmp_path_factory.mktemp("avatars") / "small"))
    engine = create_engine("musetalk", models_dir=models, version="1.0", device="cpu", dtype="float32",
                           batch_size=2)
    assert engine.featurizer.pre_norm_last  # v1.0 was trained on layer 4's output before the final norm
    engine.prepare(bundle)
    bundle = load_avatar(Path(bundle.path))
    assert bundle.manifest.engines["musetalk"]["crop_bottom_px"] == -10
    ids = np.array([0, 3])
    patches = engine.render(bundle, np.zeros((2, engine.feature_dim), np.float32), ids)
    for patch, i in zip(patches, ids, strict=True):
        box = bundle.boxes[i]
        reference = crop_face(np.asarray(bundle.frames[i]), box)
        rows = int(round(256 * (version_box(box, "1.0")[3] - box[1]) / (box[3] - box[1])))
        assert rows < 256
        np.testing.assert_array_equal(patch[rows:], reference[rows:])  # below the v1.0 crop: the frame

"""`lipstream export onnx` on the tiny same-topology MuseTalk models: graphs, gate, manifest, bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

pytest.importorskip("diffusers")
pytest.importorskip("onnxruntime")

from lipstream.cli import main  # noqa: E402
from lipstream.edge.onnx_export import (  # noqa: E402
    QUANTIZED_OPS,
    GateError,
    OnnxExportConfig,
    export_onnx,
    verify_folder,
)
from lipstream.edge.onnx_gate import GateLimits, default_inputs, run_gate, torch_reference  # noqa: E402
from lipstream.errors import LipstreamError, ModelError  # noqa: E402

# exports the tiny models to ONNX with torch (10-12 s a module fixture): the full tier
pytestmark = pytest.mark.slow

GRAPHS = ("unet", "vae_decoder", "whisper_encoder")


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random tiny MuseTalk v1.5 + v1.0 weights in the upstream layout and file formats."""
    from lipstream.engines.musetalk.topology import write_model_folder

    return write_model_folder(tmp_path_factory.mktemp("models"), versions=("1.5", "1.0"), tiny=True)


@pytest.fixture(scope="module")
def gate_inputs():
    """The real gate inputs (astronaut crops, Piper speech), made once for the module."""
    return default_inputs()


@pytest.fixture(scope="module")
def fp32_export(tiny_models: Path, gate_inputs, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A float32, batch-2 export of the tiny v1.5 models."""
    out = tmp_path_factory.mktemp("exports") / "fp32"
    export_onnx(OnnxExportConfig(tiny_models, "1.5", "float32", batch=2), out, gate_inputs)
    return out


def _leftovers(parent: Path) -> list[str]:
    return [p.name for p in parent.iterdir() if ".partial-" in p.name]


def _io(path: Path) -> dict[str, tuple[list[int], int]]:
    model = onnx.load(str(path), load_external_data=False)
    return {
        v.name: ([d.dim_value for d in v.type.tensor_type.shape.dim], v.type.tensor_type.elem_type)
        for v in list(model.graph.input) + list(model.graph.output)
    }


@pytest.mark.slow
def test_fp32_export_gate_and_manifest(fp32_export: Path) -> None:
    manifest = verify_folder(fp32_export)  # every file present, sizes and sha256 match
    gate = manifest["gate"]
    assert gate["passed"] and gate["unet_max_abs_err"] <= 1e-3 and gate["face_psnr_db"] >= 35
    assert manifest["dtype"] == "float32" and manifest["batch"] == 2 and manifest["musetalk_version"] == "1.5"
    assert manifest["audio"]["last_state"] == "layer_norm"
    for name in GRAPHS:
        entry = manifest["graphs"][name]
        assert entry["external_data"] == [f"{name}.onnx.data"]  # weights live outside the protobuf
        model = onnx.load(str(fp32_export / entry["file"]), load_external_data=False)
        assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 18
        assert not {n.op_type for n in model.graph.node} & QUANTIZED_OPS
        inferred = model.graph.value_info  # shape inference ran: intermediate tensors carry shapes
        assert len(inferred) > 10 and all(v.type.tensor_type.HasField("shape") for v in inferred)
    io = _io(fp32_export / "unet.onnx")
    assert io["latents"] == ([2, 8, 32, 32], onnx.TensorProto.FLOAT)
    assert io["audio"][0] == [2, 50, 64]  # tiny Whisper: d_model 64 (384 at full size)
    assert io["pred_latents"][0] == [2, 4, 32, 32]
    assert _io(fp32_export / "vae_decoder.onnx")["rgb"][0] == [2, 3, 256, 256]
    assert _io(fp32_export / "whisper_encoder.onnx")["states"][0] == [1, 1500, 5, 64]
    assert _leftovers(fp32_export.parent) == []


@pytest.mark.slow
def test_fp16_export_through_the_cli(tiny_models: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "fp16"
    code = main(["export", "onnx", "--models-dir", str(tiny_models), "--dtype", "float16", "--batch", "3",
                 "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    assert "face PSNR" in capsys.readouterr().out
    manifest = verify_folder(out)
    assert manifest["gate"]["passed"] and manifest["gate"]["face_psnr_db"] >= 35
    assert _io(out / "unet.onnx")["latents"] == ([3, 8, 32, 32], onnx.TensorProto.FLOAT16)
    assert _io(out / "vae_decoder.onnx")["rgb"] == ([3, 3, 256, 256], onnx.TensorProto.FLOAT16)
    assert _io(out / "whisper_encoder.onnx")["mel"][1] == onnx.TensorProto.FLOAT  # Whisper stays fp32
    assert manifest["files"]["unet.onnx.data"]["bytes"] < 0.6 * (2_216_704)  # about half the fp32 weights
    for name in GRAPHS:
        model = onnx.load(str(out / f"{name}.onnx"), load_external_data=False)
        assert not {n.op_type for n in model.graph.node} & QUANTIZED_OPS


def test_v10_whisper_graph_stacks_layer_four_before_the_final_norm(
    tiny_models: Path, gate_inputs, tmp_path: Path
) -> None:
    import onnxruntime as ort
    import torch

    from lipstream.engines.musetalk.features import stacked_states
    from lipstream.engines.musetalk.loader import load_models, resolve_runtime

    out = tmp_path / "v10"
    manifest = export_onnx(OnnxExportConfig(tiny_models, "1.0", "float32", batch=1), out, gate_inputs)
    assert manifest["musetalk_version"] == "1.0" and manifest["audio"]["last_state"] == "pre_layer_norm"
    models = load_models(tiny_models, "1.0", resolve_runtime("cpu", "fp32"))
    mel = torch.from_numpy(np.random.default_rng(0).standard_normal((1, 80, 3000)).astype(np.float32))
    with torch.inference_mode():
        pre = stacked_states(models.whisper, mel, pre_norm_last=True).numpy()
        post = stacked_states(models.whisper, mel, pre_norm_last=False).numpy()
    got = ort.InferenceSession(str(out / "whisper_encoder.onnx")).run(None, {"mel": mel.numpy()})[0]
    assert np.abs(got - pre).max() < 1e-3
    assert np.abs(got[:, :, :4] - post[:, :, :4]).max() < 1e-3  # the first four states are shared
    assert np.abs(got[:, :, 4] - post[:, :, 4]).max() > 0.1  # the last differs by the LayerNorm


def test_failing_gate_fails_the_export_with_numbers_and_writes_nothing(
    tiny_models: Path, gate_inputs, tmp_path: Path
) -> None:
    out = tmp_path / "strict"
    strict = GateLimits(face_psnr_db=200.0)  # no real export reaches it (PSNR is capped at 100)
    with pytest.raises(GateError) as err:
        export_onnx(OnnxExportConfig(tiny_models, "1.5", "float16", batch=1, limits=strict), out, gate_inputs)
    message = str(err.value)
    assert "face PSNR" in message and "< 200 dB" in message and "nothing was written" in message
    assert not out.exists() and _leftovers(tmp_path) == []


def test_a_perturbed_graph_fails_the_gate(fp32_export: Path, tiny_models: Path, gate_inputs, tmp_path):
    from onnx import numpy_helper

    from lipstream.engines.musetalk.loader import load_models, resolve_runtime

    folder = tmp_path / "tampered"
    shutil.copytree(fp32_export, folder)
    model = onnx.load(str(folder / "vae_decoder.onnx"))
    weight = next(t for t in model.graph.initializer if "conv_out" in t.name and t.name.endswith("weight"))
    weight.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(weight) * 1.5, weight.name))
    (folder / "vae_decoder.onnx.data").unlink()
    onnx.save_model(model, str(folder / "vae_decoder.onnx"), save_as_external_data=True,
                    location="vae_decoder.onnx.data")
    models = load_models(tiny_models, "1.5", resolve_runtime("cpu", "fp32"))
    ref = torch_reference(models, gate_inputs, batch=2, pre_norm_last=False)
    result = run_gate(folder, ref, "float32", 2)
    assert not result.passed and result.face_psnr_db < 35
    assert "decoded face PSNR" in result.summary and f"{result.face_psnr_db:.2f}" in result.summary
    assert run_gate(fp32_export, ref, "float32", 2).passed  # the untouched export still passes
    with pytest.raises(LipstreamError, match=r"vae_decoder\.onnx(\.data)? is corrupted"):
        verify_folder(folder)  # the manifest's sha256 names the changed file


def test_missing_weights_and_bad_options_are_one_line_errors(tiny_models: Path, tmp_path: Path, capsys):
    broken = tmp_path / "models"
    shutil.copytree(tiny_models, broken)
    (broken / "musetalkV15" / "unet.pth").unlink()
    out = tmp_path / "out"
    assert main(["export", "onnx", "--models-dir", str(broken), "-o", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "unet.pth not found" in err and "lipstream models download" in err
    assert not out.exists() and _leftovers(tmp_path) == []
    with pytest.raises(ModelError, match="unknown MuseTalk version '2.0'"):
        export_onnx(OnnxExportConfig(tiny_models, "2.0"), out)
    with pytest.raises(SystemExit):
        main(["export", "onnx", "--musetalk-version", "2.0", "-o", str(out)])
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    assert main(["export", "onnx", "--models-dir", str(tiny_models), "-o", str(tmp_path / "full")]) == 2
    assert "not an empty folder" in capsys.readouterr().err
    assert (tmp_path / "full" / "x").read_text() == "keep"
    with pytest.raises(LipstreamError, match="--batch"):
        export_onnx(OnnxExportConfig(tiny_models, batch=0), out)
    assert _leftovers(tmp_path) == []

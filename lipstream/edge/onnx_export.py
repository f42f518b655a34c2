"""`lipstream export onnx`: MuseTalk's three browser graphs, fixed shapes, gated, written atomically.

Steps per graph: TorchScript export (dynamo=False, opset 18: the dynamo exporter's opset-17 output is
invalid, reference/python-stack.md §2) of the fp32 CPU model -> optional float16 conversion
(onnxruntime's converter: fp16 weights and I/O) -> one external-data file per graph -> shape inference
and the checker -> assert no (de)quantize nodes and only fixed dims. Then the gate (onnx_gate.py) runs
on the written files; only a passing export is renamed from its temp folder to -o, with manifest.json.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lipstream import __version__
from lipstream.edge.onnx_gate import GateInputs, GateLimits, default_inputs, run_gate, torch_reference
from lipstream.edge.onnx_graphs import MEL_FRAMES, GraphSpec, graph_specs
from lipstream.engines.musetalk.features import (
    SAMPLES_PER_STEP,
    STEPS_PER_FRAME,
    WINDOW_START,
    WINDOW_STEPS,
    last_state_pre_norm,
)
from lipstream.engines.musetalk.layout import VERSIONS
from lipstream.errors import LipstreamError, ModelError
from lipstream.files import sha256_file

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = "lipstream-musetalk-onnx"
FORMAT_VERSION = 1
DTYPES = ("float16", "float32")
OPSET = 18
# int8 dynamic quantization made the UNet ~127x slower in the browser: none of these may appear
QUANTIZED_OPS = frozenset(
    {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
     "MatMulInteger", "ConvInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}
)
EXTERNAL_THRESHOLD = 1024  # bytes; 0 would push small int64 shape tensors out too, which ORT-web rejects


class GateError(LipstreamError):
    """The exported graphs do not compute what the torch engine computes (the numbers say by how much)."""


@dataclass(frozen=True)
class OnnxExportConfig:
    """What to export: from which models folder, which MuseTalk version, precision and fixed batch."""

    models_dir: Path
    version: str = "1.5"
    dtype: str = "float16"
    batch: int = 4
    opset: int = OPSET
    limits: GateLimits = field(default_factory=GateLimits)


@dataclass(frozen=True)
class GraphFile:
    """One written graph: its files and the fixed shapes of its inputs and outputs."""

    name: str
    files: tuple[str, ...]  # model first, then its external data (if any)
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    export_s: float


def validate(config: OnnxExportConfig) -> None:
    """Refuse a config that cannot work, with a one-line reason."""
    if config.version not in VERSIONS:
        raise ModelError(f"unknown MuseTalk version '{config.version}'; choose one of: {', '.join(VERSIONS)}")
    if config.dtype not in DTYPES:
        raise LipstreamError(f"unknown --dtype '{config.dtype}'; choose float16 or float32")
    if not 1 <= config.batch <= 64:
        raise LipstreamError(f"--batch must be between 1 and 64 (got {config.batch})")
    if config.opset < 18:
        raise LipstreamError(f"opset {config.opset} is too old; the export needs opset 18 or newer")


def _check_output(output: Path) -> None:
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise LipstreamError(f"{output} already exists and is not an empty folder; choose a new -o folder")
    if not output.parent.is_dir():
        raise LipstreamError(f"the folder {output.parent} does not exist; create it or choose another -o")


def _tensor_info(values) -> list[dict[str, Any]]:
    import onnx

    out = []
    for value in values:
        tensor = value.type.tensor_type
        out.append(
            {
                "name": value.name,
                "shape": [d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor.shape.dim],
                "dtype": onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type).name,
            }
        )
    return out


def check_graph(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Checker + invariants on a written graph: no quantized ops, every I/O dim fixed; returns I/O info."""
    import onnx

    onnx.checker.check_model(str(path))  # by path: works with external data and past 2 GB
    model = onnx.load(str(path), load_external_data=False)
    found = sorted({n.op_type for n in model.graph.node if n.op_type in QUANTIZED_OPS})
    if found:
        raise LipstreamError(f"{path.name} holds quantized ops {found}; the browser graphs must not")
    inputs, outputs = _tensor_info(model.graph.input), _tensor_info(model.graph.output)
    for info in inputs + outputs:
        if not all(isinstance(d, int) and d > 0 for d in info["shape"]):
            raise LipstreamError(f"{path.name}: {info['name']} has shape {info['shape']}, not a fixed one")
    opset = max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    if opset < OPSET:
        raise LipstreamError(f"{path.name} was written at opset {opset}; opset >= {OPSET} is required")
    return inputs, outputs


def constants_to_initializers(model: Any) -> None:
    """Turn Constant nodes holding a tensor into initializers (in place), so the float16 converter sees
    them as weights and keeps the inputs that must stay float32 (Resize's scales) in float32."""
    keep = []
    for node in model.graph.node:
        value = next((a for a in node.attribute if a.name == "value"), None)
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx") and value is not None:
            tensor = model.graph.initializer.add()
            tensor.CopyFrom(value.t)
            tensor.name = node.output[0]
        else:
            keep.append(node)
    del model.graph.node[:]
    model.graph.node.extend(keep)


def write_graph(spec: GraphSpec, folder: Path, half: bool, opset: int) -> GraphFile:
    """Export one spec to folder/<name>.onnx (+ <name>.onnx.data), shape-inferred and checked."""
    import onnx
    from onnx.shape_inference import infer_shapes_path

    start = time.perf_counter()
    raw = Path(tempfile.mkdtemp(dir=folder, prefix=f".raw-{spec.name}-"))
    try:
        raw_path = raw / f"{spec.name}.onnx"
        with warnings.catch_warnings(), torch.inference_mode():
            warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation and tracer warnings
            torch.onnx.export(
                spec.module,
                spec.inputs,
                str(raw_path),
                dynamo=False,
                opset_version=opset,
                input_names=list(spec.input_names),
                output_names=list(spec.output_names),
                do_constant_folding=True,
            )
        model = onnx.load(str(raw_path))  # with its external data, if the exporter split it off
        if half and spec.half:
            from onnxruntime.transformers.float16 import convert_float_to_float16

            constants_to_initializers(model)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = convert_float_to_float16(model, keep_io_types=False, disable_shape_infer=True)
        path, data = folder / f"{spec.name}.onnx", f"{spec.name}.onnx.data"
        (folder / data).unlink(missing_ok=True)  # onnx.save appends to an existing data file
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=data,
            size_threshold=EXTERNAL_THRESHOLD,
        )
        del model
        infer_shapes_path(str(path), str(path))
        inputs, outputs = check_graph(path)
    finally:
        shutil.rmtree(raw, ignore_errors=True)
    files = (path.name, data) if (folder / data).is_file() else (path.name,)
    if (folder / data).is_file():
        os.chmod(folder / data, 0o644)  # onnx writes 0600; a static web server must be able to read it
    return GraphFile(spec.name, files, inputs, outputs, round(time.perf_counter() - start, 2))


def build_manifest(
    config: OnnxExportConfig, models: Any, graphs: list[GraphFile], gate: dict, folder: Path
) -> dict[str, Any]:
    """What the browser needs to load, verify and feed the graphs."""
    pre_norm = last_state_pre_norm(config.version)
    files = {}
    for graph in graphs:
        for name in graph.files:
            files[name] = {"bytes": (folder / name).stat().st_size, "sha256": sha256_file(folder / name)}
    extractor = models.feature_extractor
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "created_by": f"lipstream {__version__}",
        "musetalk_version": config.version,
        "dtype": config.dtype,
        "batch": config.batch,
        "opset": config.opset,
        "graphs": {
            g.name: {
                "file": g.files[0],
                "external_data": list(g.files[1:]),
                "dtype": "float32" if g.name == "whisper_encoder" else config.dtype,
                "inputs": g.inputs,
                "outputs": g.outputs,
                "export_s": g.export_s,
            }
            for g in graphs
        },
        "files": files,
        "audio": {
            "sample_rate": extractor.sampling_rate,
            "mel_bins": int(extractor.feature_size),
            "mel_frames": MEL_FRAMES,
            "n_fft": int(extractor.n_fft),
            "hop_length": int(extractor.hop_length),
            "segment_samples": int(extractor.n_samples),
            "samples_per_step": SAMPLES_PER_STEP,
            "steps_per_frame": STEPS_PER_FRAME,
            "window_start": WINDOW_START,
            "window_steps": WINDOW_STEPS,
            "states": models.audio_states,
            "last_state": "pre_layer_norm" if pre_norm else "layer_norm",
            "windowing": "frame f reads steps [2f-4, 2f+6) of the stacked states, zeros outside "
            "[0, floor(samples/320)), flattened time-major to [10*states, d_model]",
        },
        "unet": {"timestep": 0, "positional_encoding": "inside the graph"},
        "vae_decoder": {"scaling_factor": models.scaling_factor, "output": "RGB 0..255, rounded, NCHW"},
        "gate": gate,
    }


def export_onnx(config: OnnxExportConfig, output: Path, inputs: GateInputs | None = None) -> dict[str, Any]:
    """Export, gate and atomically write the three graphs and manifest.json to `output`; return the manifest.

    Raises ModelError for missing/unknown weights and GateError (nothing written) when the gate fails."""
    from lipstream.engines.musetalk.loader import load_models, resolve_runtime

    validate(config)
    output = Path(output).absolute()
    _check_output(output)
    models = load_models(Path(config.models_dir), config.version, resolve_runtime("cpu", "fp32"))
    inputs = inputs or default_inputs()
    pre_norm = last_state_pre_norm(config.version)
    stage = Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.partial-"))
    try:
        ref = torch_reference(models, inputs, config.batch, pre_norm)
        graphs = [
            write_graph(spec, stage, config.dtype == "float16", config.opset)
            for spec in graph_specs(models, config.batch, pre_norm)
        ]
        result = run_gate(stage, ref, config.dtype, config.batch, config.limits)
        log.info("gate: %s", result.summary)
        if not result.passed:
            raise GateError(f"ONNX export gate {result.summary}; nothing was written to {output}")
        manifest = build_manifest(config, models, graphs, result.to_json(), stage)
        (stage / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        os.chmod(stage, 0o755)  # mkdtemp makes 0700
        if output.exists():
            output.rmdir()  # empty (checked above)
        os.replace(stage, output)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return manifest


def verify_folder(folder: Path) -> dict[str, Any]:
    """Check every file the manifest lists against its size and sha256; name the first bad one."""
    folder = Path(folder)
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        raise LipstreamError(f"{manifest_path} is missing; re-run `lipstream export onnx`")
    manifest = json.loads(manifest_path.read_text())
    for name, info in manifest["files"].items():
        path = folder / name
        if not path.is_file():
            raise LipstreamError(f"{path} is missing; re-run `lipstream export onnx`")
        if path.stat().st_size != info["bytes"] or sha256_file(path) != info["sha256"]:
            raise LipstreamError(f"{path} is corrupted (size or sha256 differs from {MANIFEST}); re-export")
    return manifest

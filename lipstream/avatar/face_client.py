"""mediapipe's face models for the tracker: in this process when mediapipe is importable here (an older
single-environment install), else in a child process run by the face environment's Python (face_env)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import select
import signal
import subprocess
import weakref
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from lipstream.avatar import face_worker
from lipstream.avatar.face_env import FACE_ENV_VAR, face_python
from lipstream.errors import LipstreamError

STOP_TIMEOUT_S = 5.0


class FaceModels(Protocol):
    """What the tracker and the breathing matte call (lipstream.avatar.face_worker.MediapipeFaceModels)."""

    def detect(self, frame_rgb: np.ndarray) -> np.ndarray: ...
    def mesh(self, crop_rgb: np.ndarray) -> np.ndarray | None: ...
    def reset_mesh(self) -> None: ...
    def segment(self, frame_rgb: np.ndarray) -> np.ndarray | None: ...
    def close(self) -> None: ...


@runtime_checkable
class StartsInBackground(Protocol):
    """Face models that may still be starting (the worker process importing mediapipe); asked with
    isinstance, so models handed in without it are taken as ready."""

    def ready(self) -> bool:
        """Whether they answer without a wait."""


def open_face_models(detection_confidence: float = 0.5, tracking_confidence: float = 0.5) -> FaceModels:
    """The face models: in process if mediapipe is installed here (and $LIPSTREAM_FACE_PYTHON is unset),
    else the face environment's worker."""
    if not os.environ.get(FACE_ENV_VAR) and mediapipe_runs_here():
        return face_worker.MediapipeFaceModels(detection_confidence, tracking_confidence)
    return FaceWorker(detection_confidence, tracking_confidence)


def mediapipe_runs_here() -> bool:
    """mediapipe is importable in this process with a protobuf its graphs parse under (< 5): an older
    setup. A mediapipe left behind in an environment whose protobuf moved on to 5 would fail at its first
    graph, so the face environment's worker is used then."""
    if importlib.util.find_spec("mediapipe") is None:
        return False
    try:
        return int(importlib.metadata.version("protobuf").split(".")[0]) < 5
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False


def _stop(process: subprocess.Popen) -> None:
    """End the worker: its input closes (it exits at the end of the stream), else it is killed."""
    if process.poll() is None:
        try:
            process.stdin.close()
            process.wait(timeout=STOP_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
    for stream in (process.stdin, process.stdout):
        try:
            stream.close()
        except OSError:  # a dead child's pipe: what was still buffered for it cannot be delivered
            pass


def describe_exit(code: int) -> str:
    """'exit code 3' or 'signal SIGSEGV' for a process's return code."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


class FaceWorker:
    """MediapipeFaceModels in a child process (the face environment's Python running face_worker.py), one
    request at a time over its stdin/stdout; its stderr is ours. Closing it (or collecting it, or the
    interpreter's exit) ends the child; a child that dies mid-way raises a LipstreamError naming the fix."""

    def __init__(
        self, detection_confidence: float = 0.5, tracking_confidence: float = 0.5, python: Path | None = None
    ) -> None:
        self.python = python or face_python()
        settings = {"detection_confidence": detection_confidence, "tracking_confidence": tracking_confidence}
        # -I: the script's folder (lipstream/avatar) is not put on sys.path, nor are user site-packages
        command = [str(self.python), "-I", face_worker.__file__, json.dumps(settings)]
        try:
            self._process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        except OSError as exc:
            raise LipstreamError(f"cannot start the face tracker with {self.python}: {exc}") from None
        self.pid = self._process.pid
        self._stop = weakref.finalize(self, _stop, self._process)
        # asked at once, answered when mediapipe is imported (a second or more): `ready` tells, unblocking
        self._booting = True
        try:
            face_worker.write_message(self._process.stdin, {"op": "ping"})
        except OSError:  # a child that died at once: its first request says how
            pass

    def ready(self) -> bool:
        """Whether the worker has started (imported mediapipe), without waiting for it."""
        if self._booting and self._stop.alive:
            if select.select([self._process.stdout], [], [], 0)[0]:
                self._await_boot()
        return not self._booting

    def _await_boot(self) -> None:
        """Take the start-up ping's answer (waits until the worker has started)."""
        self._booting = False
        self._reply("ping")

    def _request(self, op: str, frame: np.ndarray | None = None) -> tuple[dict, bytes]:
        if not self._stop.alive:
            raise LipstreamError("the face tracker was closed; open a new one")
        if self._booting:
            self._await_boot()
        header, payload = face_worker.array_message(frame) if frame is not None else ({}, b"")
        try:
            face_worker.write_message(self._process.stdin, {**header, "op": op}, payload)
        except OSError:
            raise self._died() from None
        return self._reply(op)

    def _reply(self, op: str) -> tuple[dict, bytes]:
        try:
            reply = face_worker.read_message(self._process.stdout)
        except (OSError, EOFError, ValueError):
            reply = None
        if reply is None:
            raise self._died()
        if not reply[0].get("ok"):
            raise LipstreamError(f"the face tracker could not {op}: {reply[0].get('error')}")
        return reply

    def _call(self, op: str, frame: np.ndarray | None = None) -> np.ndarray | None:
        return face_worker.message_array(*self._request(op, frame))

    def _died(self) -> LipstreamError:
        try:
            code = self._process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            code = self._process.wait()
        self._stop()
        return LipstreamError(
            f"the face tracker process ({self.python}) stopped with {describe_exit(code)}; its messages are "
            "above. Check it with `lipstream doctor`; if the face environment is broken, delete it and run "
            "`lipstream models face` again"
        )

    def ping(self) -> str:
        """The worker's mediapipe version (a round trip: it started and imported mediapipe)."""
        return str(self._request("ping")[0]["mediapipe"])

    def detect(self, frame_rgb: np.ndarray) -> np.ndarray:
        """Relative boxes (n×4: xmin, ymin, width, height) of the faces the full-range detector finds."""
        return self._call("detect", frame_rgb)

    def mesh(self, crop_rgb: np.ndarray) -> np.ndarray | None:
        """FaceMesh's 478×2 landmarks relative to the square crop, or None."""
        return self._call("mesh", crop_rgb)

    def reset_mesh(self) -> None:
        """Start FaceMesh afresh (it forgets the face it was tracking)."""
        self._call("reset_mesh")

    def segment(self, frame_rgb: np.ndarray) -> np.ndarray | None:
        """Selfie segmentation's person confidence (h×w float32), or None."""
        return self._call("segment", frame_rgb)

    def close(self) -> None:
        """End the child process (idempotent)."""
        self._stop()

    def __enter__(self) -> FaceWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

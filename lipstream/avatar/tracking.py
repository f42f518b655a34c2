"""Face tracking on any video: full-range detection to find the face, FaceMesh on a crop around it.

mediapipe's FaceMesh has a short-range detector inside, which misses faces that are small relative to
the frame (a 200 px face on a 1080×1920 canvas). So the full-range FaceDetection finds the largest face
on the first frame (and whenever tracking is lost), and FaceMesh then runs in tracking mode on a square
crop of about twice the face box that follows the face from frame to frame.

mediapipe itself runs in the face environment's Python (lipstream.avatar.face_client): this module, and
everything that imports it, only needs numpy here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lipstream.avatar.face_client import FaceModels, StartsInBackground, open_face_models

LANDMARK_COUNT = 478  # FaceMesh with refine_landmarks=True (468 + 10 iris points)
LANDMARK_MODEL = "mediapipe-0.10.21 face_detection_full_range + face_landmark_with_attention (478 points)"


@dataclass(frozen=True)
class TrackerConfig:
    """Knobs of the face tracker."""

    detection_confidence: float = 0.5
    tracking_confidence: float = 0.5
    crop_scale: float = 2.0  # side of the FaceMesh crop, in face-box sizes
    min_face_px: int = 24  # faces smaller than this (box width) are ignored


@dataclass(frozen=True)
class FaceBox:
    """A face box in source pixels (float, exclusive x2/y2)."""

    x1: float
    y1: float
    x2: float
    y2: float

    @property
    def size(self) -> float:
        """Larger side of the box."""
        return max(self.x2 - self.x1, self.y2 - self.y1)

    @property
    def area(self) -> float:
        """Area in square pixels."""
        return max(0.0, self.x2 - self.x1) * max(0.0, self.y2 - self.y1)


class FaceTracker:
    """Stateful tracker of the largest face: `track(frame)` gives 478×2 source-pixel landmarks or None."""

    def __init__(self, config: TrackerConfig | None = None, models: FaceModels | None = None) -> None:
        self.config = config or TrackerConfig()
        self._models = models  # mediapipe's graphs (or their worker process), made on first use
        self._box: FaceBox | None = None
        self.faces_seen = 0  # most faces the detector saw in one frame
        self.detections = 0  # how often the full-range detector ran
        self.frames = 0

    @property
    def models(self) -> FaceModels:
        """The face models, started on first use (the face environment's worker, unless mediapipe is here)."""
        if self._models is None:
            self._models = open_face_models(self.config.detection_confidence, self.config.tracking_confidence)
        return self._models

    def start(self) -> None:
        """Start the face models now, so their process imports mediapipe while the caller decodes."""
        _ = self.models

    def ready(self) -> bool:
        """Whether the face models answer without a wait (their process has started)."""
        models = self.models  # models handed in that cannot tell are taken as ready
        return not isinstance(models, StartsInBackground) or bool(models.ready())

    @property
    def multiple_faces_note(self) -> str | None:
        """A sentence for the user when the detector saw more than one face, else None."""
        if self.faces_seen > 1:
            return f"several faces ({self.faces_seen}) in the source; took the largest"
        return None

    def reset(self) -> None:
        """Forget the last face box (the next frame runs full-range detection)."""
        self._box = None
        if self._models is not None:
            self._models.reset_mesh()

    def close(self) -> None:
        """Release the mediapipe graphs (and end their worker process)."""
        if self._models is not None:
            self._models.close()
            self._models = None

    def __enter__(self) -> FaceTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def detect(self, frame_rgb: np.ndarray) -> list[FaceBox]:
        """All faces the full-range detector finds, largest first."""
        self.detections += 1
        h, w = frame_rgb.shape[:2]
        boxes = []
        for xmin, ymin, width, height in self.models.detect(frame_rgb).tolist():
            box = FaceBox(xmin * w, ymin * h, (xmin + width) * w, (ymin + height) * h)
            if box.x2 - box.x1 >= self.config.min_face_px:
                boxes.append(box)
        boxes.sort(key=lambda b: b.area, reverse=True)
        self.faces_seen = max(self.faces_seen, len(boxes))
        return boxes

    def _crop_window(self, box: FaceBox) -> tuple[int, int, int]:
        """(x1, y1, side) of a square window around the box; it may reach past the frame's edges."""
        side = max(8, int(round(box.size * self.config.crop_scale)))
        cx, cy = (box.x1 + box.x2) / 2, (box.y1 + box.y2) / 2
        return int(round(cx - side / 2)), int(round(cy - side / 2)), side

    def _mesh_on(self, frame_rgb: np.ndarray, box: FaceBox) -> np.ndarray | None:
        h, w = frame_rgb.shape[:2]
        x1, y1, side = self._crop_window(box)
        sx1, sy1 = max(0, x1), max(0, y1)
        sx2, sy2 = min(w, x1 + side), min(h, y1 + side)
        if sx2 - sx1 < 8 or sy2 - sy1 < 8:
            return None
        if (sx1, sy1, sx2, sy2) == (x1, y1, x1 + side, y1 + side):
            crop = np.ascontiguousarray(frame_rgb[sy1:sy2, sx1:sx2])
        else:
            # FaceMesh projects landmarks correctly only from a square input: pad at the frame's edges.
            crop = np.zeros((side, side, 3), dtype=np.uint8)
            crop[sy1 - y1 : sy2 - y1, sx1 - x1 : sx2 - x1] = frame_rgb[sy1:sy2, sx1:sx2]
        relative = self.models.mesh(crop)
        if relative is None:
            return None
        out = relative * side
        out += np.array([x1, y1], dtype=np.float32)
        return out

    def track(self, frame_rgb: np.ndarray) -> np.ndarray | None:
        """Landmarks (478×2 float32, source pixels) of the largest face in this frame, or None."""
        self.frames += 1
        landmarks = self._mesh_on(frame_rgb, self._box) if self._box is not None else None
        if landmarks is None:
            # Lost (or first frame): find the face again with the full-range detector, restart the mesh.
            self.reset()
            boxes = self.detect(frame_rgb)
            if not boxes:
                return None
            landmarks = self._mesh_on(frame_rgb, boxes[0])
            if landmarks is None:
                return None
        x_min, y_min = landmarks.min(axis=0)
        x_max, y_max = landmarks.max(axis=0)
        self._box = FaceBox(float(x_min), float(y_min), float(x_max), float(y_max))
        return landmarks

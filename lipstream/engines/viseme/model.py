"""The small audio -> articulation network: numpy-only inference from a shipped .npz."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lipstream.engines.viseme.acoustic import AcousticConfig
from lipstream.errors import ModelError

DEFAULT_MODEL_PATH = Path(__file__).resolve().parent.parent / "data" / "viseme_mlp.npz"


@dataclass(frozen=True)
class ArticulationModel:
    """An MLP over a window of acoustic frames [k-before, k+after] -> (open, width, closure)."""

    before: int
    after: int
    mean: np.ndarray  # [input_dim] normalisation of the stacked window
    std: np.ndarray
    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]
    acoustic: AcousticConfig

    @property
    def outputs(self) -> int:
        """3 (open, width, closure) or 4 (and f/v)."""
        return int(self.biases[-1].shape[0])

    @property
    def context(self) -> int:
        """Frames in one input window."""
        return self.before + 1 + self.after

    def predict(self, acoustic: np.ndarray) -> np.ndarray:
        """Articulation [n, outputs] for acoustic rows [n + before + after, d] (rows already include context):
        open, width, closure, and f/v (labiodental) when the model was trained with that head."""
        n = acoustic.shape[0] - self.before - self.after
        if n <= 0:
            return np.zeros((0, self.outputs), dtype=np.float32)
        # Sliding windows as a strided view; stacking rows k-before..k+after into one input vector.
        win = np.lib.stride_tricks.sliding_window_view(acoustic, self.context, axis=0)  # [n, d, ctx]
        x = win.transpose(0, 2, 1).reshape(n, -1)
        h = (x - self.mean) / self.std
        for w, b in zip(self.weights[:-1], self.biases[:-1], strict=True):
            h = np.tanh(h @ w + b)
        z = h @ self.weights[-1] + self.biases[-1]
        out = np.empty_like(z)
        out[:, 0] = 1.0 / (1.0 + np.exp(-z[:, 0]))
        out[:, 1] = np.tanh(z[:, 1])
        out[:, 2:] = 1.0 / (1.0 + np.exp(-z[:, 2:]))
        return out.astype(np.float32)

    def save(self, path: Path, **metadata: object) -> None:
        """Write the weights and their metadata to an .npz."""
        arrays = {f"w{i}": w for i, w in enumerate(self.weights)}
        arrays.update({f"b{i}": b for i, b in enumerate(self.biases)})
        np.savez_compressed(
            path,
            before=self.before,
            after=self.after,
            mean=self.mean,
            std=self.std,
            layers=len(self.weights),
            n_mels=self.acoustic.n_mels,
            fmin=self.acoustic.fmin,
            fmax=self.acoustic.fmax,
            metadata=np.array(repr(metadata)),
            **arrays,
        )


def load_model(path: str | Path | None = None) -> ArticulationModel:
    """Read an ArticulationModel from .npz (default: the weights shipped in lipstream/engines/data)."""
    path = Path(path) if path else DEFAULT_MODEL_PATH
    if not path.is_file():
        raise ModelError(
            f"viseme model weights not found at {path}; reinstall lipstream or run "
            "scripts/train_viseme_model.py to rebuild them"
        )
    try:
        with np.load(path) as z:
            layers = int(z["layers"])
            return ArticulationModel(
                before=int(z["before"]),
                after=int(z["after"]),
                mean=z["mean"].astype(np.float32),
                std=z["std"].astype(np.float32),
                weights=tuple(z[f"w{i}"].astype(np.float32) for i in range(layers)),
                biases=tuple(z[f"b{i}"].astype(np.float32) for i in range(layers)),
                acoustic=AcousticConfig(int(z["n_mels"]), float(z["fmin"]), float(z["fmax"])),
            )
    except (KeyError, ValueError, OSError) as exc:
        raise ModelError(f"viseme model weights at {path} are unreadable ({exc}); rebuild them") from exc

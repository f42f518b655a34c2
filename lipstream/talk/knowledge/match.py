"""A question's words matched to the notes' own, as a person at the desk would: a word the notes never use is
read as the notes' word it was most likely heard for (Whisper's "cast" for "cost", "color" for "colour") or
meant as ("vehicle" for "car", "kids" for "children").

Three matchers, each against the index's vocabulary (its surface words, lower case):

- **spelling** (rapidfuzz's normalised Levenshtein ratio, >= 80 %): inflections Porter misses and misheard
  words a letter or two off;
- **part** (a word the notes only use inside a compound of theirs, "word" -> "password"): the share of the
  compound's letters it is;
- **meaning** (WordLlama's static token embeddings, shipped inside its wheel, run on numpy: the cosine of two
  words' first 64 dimensions, >= 0.66): paraphrase. Measured on the knowledge desk benchmark's questions:
  "animal" -> "dogs" 0.75, "vehicle" -> "car" 0.78, "eat" -> "food" 0.71, "kids" -> "children" 0.92, "age"
  -> "old" 0.76; below the cutoff "long" -> "day" 0.66, "laptop" -> "computers" 0.65, "adults" -> "people"
  0.58, and the nearest words of "chess", "pool", "swimming" under 0.3. Whole-sentence similarity from the
  same model was measured and rejected: the right sentence won in 3 of 7 paraphrased questions.

A word matched either way stands for its notes' term at its similarity's share of that term's weight.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from lipstream.talk.knowledge.text import STOP_WORDS, stem, terms, words

log = logging.getLogger(__name__)

SPELLING_CUTOFF = 80.0  # rapidfuzz ratio, %: "later"/"late" 89, "dvd"/"dvds" 86; 75 let "give" be "five"
MEANING_CUTOFF = 0.66  # cosine of WordLlama word vectors cut to DIMENSIONS (the measured pairs above)
# WordLlama's vectors are trained to be cut short (Matryoshka): 64 of 256 dimensions keep the word pairs above
# apart and make the search of a 1,000-page vocabulary (18,000 words) 4x cheaper (a few ms -> under 1)
DIMENSIONS = 64
MIN_FUZZY_CHARS = 3  # "dvd" finds "dvds"; two letters ("me" -> "mi") are noise
# a compound's part, and the rest of it, have at least this many letters ("word" | "pass"; not "ring" in
# "during", "ward" in "award")
MIN_PART_CHARS = 4


@dataclass(frozen=True)
class Query:
    """A question's content terms, what each unknown one was matched to, and each term's weight (IDF)."""

    terms: tuple[str, ...]  # the question's own terms, in order, once each
    mapped: dict[str, tuple[str, float]] = field(default_factory=dict)  # unknown term -> (notes' term, sim)
    idf: dict[str, float] = field(default_factory=dict)  # every term's log(chunks / chunks holding it)
    unknown_idf: float = 1.0  # the weight of a term no chunk holds (the largest there is)
    surface: tuple[tuple[str, str], ...] = ()  # the question's content words as said, with their terms

    def search_terms(self) -> list[str]:
        """The terms to look up: the question's known terms and, for its unknown ones, the notes' terms."""
        out = [self.mapped[t][0] if t in self.mapped else t for t in self.terms]
        return list(dict.fromkeys(out))

    def weights(self) -> dict[str, float]:
        """Each term a sentence may hold, by weight: the question's own by IDF, a matched one at its share."""
        out = {t: self.idf.get(t, self.unknown_idf) for t in self.terms if t not in self.mapped}
        for notes_term, similarity in self.mapped.values():
            out[notes_term] = max(out.get(notes_term, 0.0), similarity * self.idf.get(notes_term, 0.0))
        return out

    def coverage(self, held: set[str]) -> float:
        """The share of the question's weight a text holding the terms `held` answers: an unknown term
        unmatched weighs most (the notes know nothing about it)."""
        total = got = 0.0
        for term in self.terms:
            if term in self.mapped:
                notes_term, similarity = self.mapped[term]
                weight = self.idf.get(notes_term, self.unknown_idf)
                got += similarity * weight if notes_term in held else 0.0
            else:
                weight = self.idf.get(term, self.unknown_idf)
                got += weight if term in held else 0.0
            total += weight
        return 1.0 if total == 0 else got / total


def content_words(text: str) -> tuple[tuple[str, str], ...]:
    """The content words of `text` as said (lower case, letters only), each once, with their terms."""
    out: dict[str, str] = {}
    for word in words(text):
        lower = word.lower().replace("’", "'")
        if lower.endswith("'s"):
            lower = lower[:-2]
        if lower.isalpha() and lower not in STOP_WORDS:
            out.setdefault(lower, stem(lower))
    return tuple(out.items())


def idf(df: Mapping[str, int], chunks: int, term: str) -> float:
    """log((chunks + 1) / (chunks holding the term + 0.5)): rare terms weigh most."""
    return math.log((chunks + 1) / (df.get(term, 0) + 0.5))


@functools.lru_cache(maxsize=1)  # why: one 16 MB model per process, shared by every knowledge base
def word_model() -> object | None:
    """WordLlama's bundled model (l2_supercat, 256 dimensions) built from the files inside its wheel (its own
    loader looks for the tokenizer in a folder the wheel does not have, then downloads); None when the
    package is not installed."""
    try:
        import wordllama
        from safetensors import safe_open
        from tokenizers import Tokenizer
        from wordllama.inference import WordLlamaInference
    except ImportError:
        return None
    root = Path(wordllama.__file__).parent
    tokenizer_file = root / "tokenizers" / "l2_supercat_tokenizer_config.json"
    weights_file = root / "weights" / "l2_supercat_256.safetensors"
    if not (tokenizer_file.is_file() and weights_file.is_file()):
        log.warning("wordllama's bundled model is missing from %s: paraphrase matching is off", root)
        return None
    with safe_open(str(weights_file), framework="np") as f:
        embedding = f.get_tensor("embedding.weight")
    return WordLlamaInference(embedding, Tokenizer.from_file(str(tokenizer_file)))


def embed_words(vocabulary: Sequence[str]) -> np.ndarray | None:
    """Unit vectors (float16, 256 dimensions) of the words, one row each; None without the model."""
    model = word_model()
    if model is None or not vocabulary:
        return None
    vectors = model.embed(list(vocabulary), norm=False, batch_size=512)  # type: ignore[attr-defined]
    return _unit(np.asarray(vectors, dtype=np.float32)).astype(np.float16)


def _unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-9)


class Vocabulary:
    """The notes' surface words with their terms, matched against a question's unknown words."""

    def __init__(self, surface: Sequence[str], term_of: Sequence[str], vectors: np.ndarray | None) -> None:
        """`surface`: the notes' words; `term_of`: each one's term; `vectors`: their unit vectors or None."""
        self.surface = list(surface)
        self.term_of = list(term_of)
        # all 256 dimensions to align a question with a sentence (a few hundred words); the first 64 to
        # search the whole vocabulary for an unknown word's nearest (18,000 words on 1,000 pages)
        self.full = None if vectors is None else _unit(np.asarray(vectors, dtype=np.float32))
        self.vectors = None if self.full is None else _unit(self.full[:, :DIMENSIONS])
        self.row = {word: index for index, word in enumerate(self.surface)}
        # the words by length: a word heard a letter or two off has about the same length (a 1,000-page
        # vocabulary is 18,000 words; rapidfuzz over all of them took ~10 ms a word on a loaded machine)
        self._by_length: dict[int, list[int]] = {}
        # ... and by their first and last letters, for the compounds a word is a part of (2 ms a word when
        # each of the 18,000 was tried)
        self._by_start: dict[str, list[int]] = {}
        self._by_end: dict[str, list[int]] = {}
        for index, word in enumerate(self.surface):
            self._by_length.setdefault(len(word), []).append(index)
            self._by_start.setdefault(word[:MIN_PART_CHARS], []).append(index)
            self._by_end.setdefault(word[-MIN_PART_CHARS:], []).append(index)

    def spelled_like(self, word: str) -> tuple[str, float] | None:
        """The notes' word closest in spelling to `word` (>= SPELLING_CUTOFF), as (term, similarity)."""
        if len(word) < MIN_FUZZY_CHARS or not self.surface:
            return None
        from rapidfuzz import fuzz, process

        near = [i for n in range(len(word) - 2, len(word) + 3) for i in self._by_length.get(n, [])]
        hit = process.extractOne(word, [self.surface[i] for i in near], scorer=fuzz.ratio,
                                 score_cutoff=SPELLING_CUTOFF)  # fmt: skip
        return None if hit is None else (self.term_of[near[hit[2]]], hit[1] / 100.0)

    def part_of(self, word: str) -> tuple[str, float] | None:
        """The notes' shortest word that `word` begins or ends with a word of its own after or before it
        ("word" in "password", "book" in "audiobooks": a compound heard in part, or said apart), as (term,
        the share of its letters `word` is); None when none is, or `word` is under MIN_PART_CHARS."""
        if len(word) < MIN_PART_CHARS:
            return None
        best: int | None = None
        near = self._by_start.get(word[:MIN_PART_CHARS], []) + self._by_end.get(word[-MIN_PART_CHARS:], [])
        for index in near:
            notes_word = self.surface[index]
            rest = len(notes_word) - len(word)
            if rest >= MIN_PART_CHARS - 1 and (notes_word.endswith(word) or notes_word.startswith(word)):
                if best is None or len(notes_word) < len(self.surface[best]):
                    best = index
        return None if best is None else (self.term_of[best], len(word) / len(self.surface[best]))

    def meant_like(self, word: str) -> tuple[str, float] | None:
        """The notes' word closest in meaning to `word` (cosine >= MEANING_CUTOFF), as (term, cosine)."""
        model = word_model()
        if model is None or self.vectors is None or len(self.vectors) == 0:
            return None
        vector = np.asarray(model.embed([word], norm=False), dtype=np.float32)[0]  # type: ignore[attr-defined]
        scores = self.vectors @ _unit(vector[: self.vectors.shape[1]])
        best = int(np.argmax(scores))
        score = float(scores[best])
        return (self.term_of[best], score) if score >= MEANING_CUTOFF else None

    def aligner(self, query: Query) -> Callable[[str], float] | None:
        """A score of how well a text answers `query`, 0-1 (None without word vectors): each question word
        counts at its weight (IDF; an unknown word the most) times its best cosine with the text's words (1
        when the text holds its term, at least its match's similarity when the text holds the notes' word it
        was read as) — "vehicle" in a question meets "car" in a sentence at 0.69."""
        model = word_model()
        if model is None or self.full is None or not query.surface:
            return None
        asked = [w for w, _ in query.surface]
        wanted = [t for _, t in query.surface]
        vectors = np.asarray(model.embed(asked, norm=False), dtype=np.float32)  # type: ignore[attr-defined]
        qv = _unit(vectors[:, : self.full.shape[1]])
        weights = np.array([query.idf.get(t, query.unknown_idf) for t in wanted])
        total = max(float(weights.sum()), 1e-9)

        def score(text: str) -> float:
            held = set(terms(text))
            rows = [self.row[w] for w in {w.lower() for w in words(text)} if w in self.row]
            sims = np.zeros(len(asked)) if not rows else np.clip((qv @ self.full[rows].T).max(axis=1), 0, 1)
            sims = np.where([t in held for t in wanted], 1.0, sims)
            # a word read as one of the notes' words counts at its similarity where the text holds that word
            sims = np.maximum(sims, [query.mapped[t][1] if t in query.mapped and query.mapped[t][0] in held
                                     else 0.0 for t in wanted])  # fmt: skip
            return float((weights * sims).sum() / total)

        return score

    def match(self, question: str, known: Mapping[str, int]) -> dict[str, tuple[str, float]]:
        """Each content term of `question` the notes never hold -> the notes' term heard or meant for it."""
        out: dict[str, tuple[str, float]] = {}
        for word in words(question):
            lower = word.lower().replace("’", "'")
            term = stem(lower)
            if lower in STOP_WORDS or term in known or term in out or not lower.isalpha():
                continue
            # a real word first ("eat" is not "seat"), then a part of one of the notes' compounds
            hit = self.meant_like(lower) or self.spelled_like(lower) or self.part_of(lower)
            if hit is not None:
                out[term] = hit
        return out

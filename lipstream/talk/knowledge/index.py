"""The user's own documents as a knowledge source: a file or folder of Markdown / plain text (PDF where pypdf
is installed), cut into chunks under their headings and indexed in SQLite FTS5, searched with BM25.

The index is cached at $LIPSTREAM_HOME/knowledge/<hash of the path>.sqlite and rebuilt when a document is
added, removed or changed (its mtime or size). Bad input is refused when the knowledge base is opened (at
start, before any session) with a KnowledgeError naming the file and what to do.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import sqlite3
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lipstream.errors import LipstreamError
from lipstream.paths import lipstream_home
from lipstream.talk.knowledge.match import Query, Vocabulary, content_words, embed_words, idf, word_model
from lipstream.talk.knowledge.meaning import NoteVectors, embed_notes, sentence_model
from lipstream.talk.knowledge.sentence_model import bundled_model_dir
from lipstream.talk.knowledge.text import (
    STOP_WORDS,
    Chunk,
    chunk_document,
    intent_terms,
    sentences,
    stem,
    terms,
    words,
)

log = logging.getLogger(__name__)

TEXT_SUFFIXES = frozenset({".md", ".markdown", ".txt", ".text"})
PDF_SUFFIX = ".pdf"
MAX_FILE_BYTES = 5 * 1024 * 1024
MAX_DOCUMENTS = 10_000
# notes this small (~50 pages) are read whole by the re-ranker, so a question sharing no word with its
# answer still finds it; a larger index re-ranks what BM25 found
READ_WHOLE_CHUNKS = 300
RERANK_POOL = 8  # BM25's best chunks the re-ranker orders
# a chunk BM25 did not find is a candidate only when the re-ranker reads this much of the question in it
# (under it: "Does the library sell coffee?" would find every chunk that says "library")
MIN_UNMATCHED_COVERAGE = 0.4
RANK_COVERAGE_WEIGHT = 0.5  # a passage ranks by its meaning + this share of its word coverage
SCHEMA = 9  # bump when the index's layout or the chunking changes: older caches are rebuilt


class KnowledgeError(LipstreamError):
    """A knowledge path that cannot be indexed: missing, empty, binary, unreadable or too large."""


@dataclass(frozen=True)
class Passage:
    """A chunk found for a question: its text, where it came from, and how well it matched."""

    source: str
    heading: str
    text: str
    score: float  # BM25, higher is better
    matched: tuple[str, ...]  # the question's terms it holds
    distinctive: bool  # it holds a question term that few chunks hold (not just "library" in a library's FAQ)
    coverage: float = 1.0  # the share of the question's weight it holds (Query.coverage)
    meaning: float = 0.0  # its best sentence's cosine with the question (knowledge_meaning), 0 without
    meant: bool = False  # it stands out from the rest of the notes in meaning: it answers the question
    sentence_meanings: tuple[float, ...] = ()  # each of sentences(text)'s cosine with the question


@dataclass(frozen=True)
class KnowledgeStats:
    """What `doctor` and /healthz say about an index."""

    path: str
    index: str
    documents: int
    chunks: int
    built_at: float  # time.time() of the last build

    def age_seconds(self, now: float | None = None) -> float:
        """Seconds since the index was built."""
        return max(0.0, (time.time() if now is None else now) - self.built_at)


def index_path(root: Path, home: Path | None = None) -> Path:
    """Where the index of `root` is cached: $LIPSTREAM_HOME/knowledge/<hash of the resolved path>.sqlite."""
    digest = hashlib.sha256(str(root.resolve()).encode()).hexdigest()[:16]
    return (home or lipstream_home()) / "knowledge" / f"{digest}.sqlite"


class KnowledgeBase:
    """A searchable index over a file or folder of documents (opened, checked and (re)built at once)."""

    def __init__(
        self, path: str | os.PathLike, home: Path | None = None, chunk_chars: int = 700,
        max_file_bytes: int = MAX_FILE_BYTES,
    ) -> None:  # fmt: skip
        """`path`: a document or a folder of them; `home`: the data home the index is cached under (default
        $LIPSTREAM_HOME); `chunk_chars`: the longest chunk."""
        self.root = Path(path).expanduser()
        self.chunk_chars = chunk_chars
        self.max_file_bytes = max_file_bytes
        self.index = index_path(self.root, home)
        self._lock = threading.Lock()
        files = self._documents()
        stamps = [(self._name(f), st.st_mtime_ns, st.st_size) for f, st in files]
        self.rebuilt = False
        db = self._open_cached(stamps)
        if db is None:
            self._build(files, stamps)
            self.rebuilt = True
            db = self._open_cached(stamps)
            assert db is not None
        self._db = db
        self._chunks = int(db.execute("SELECT count(*) FROM chunks").fetchone()[0])
        self.vocabulary = self._load_vocabulary(db)
        self.notes = self._load_note_vectors(db)
        if self.vocabulary.vectors is not None:  # the word model loads (~1.5 s) before the first question
            threading.Thread(target=word_model, name="knowledge-word-model", daemon=True).start()
        if self.notes is not None:  # and the sentence model (~0.5 s)
            threading.Thread(target=sentence_model, name="knowledge-sentence-model", daemon=True).start()

    def _load_vocabulary(self, db: sqlite3.Connection) -> Vocabulary:
        """The notes' surface words, their terms and word vectors, as the index stored them."""
        rows = db.execute("SELECT word, term FROM vocab ORDER BY rowid").fetchall()
        blob = db.execute("SELECT data FROM blobs WHERE name = 'vectors'").fetchone()
        vectors = None
        if blob is not None and rows:
            vectors = np.frombuffer(blob[0], dtype=np.float16).reshape(len(rows), -1)
        return Vocabulary([w for w, _ in rows], [t for _, t in rows], vectors)

    def _load_note_vectors(self, db: sqlite3.Connection) -> NoteVectors | None:
        """The notes' sentence vectors as the index stored them (None: built without, or notes too large)."""
        blobs = dict(db.execute("SELECT name, data FROM blobs WHERE name LIKE 'sentence_%'").fetchall())
        if "sentence_vectors" not in blobs:
            return None
        counts = np.frombuffer(blobs["sentence_counts"], dtype=np.int32)
        vectors = np.frombuffer(blobs["sentence_vectors"], dtype=np.float16).reshape(int(counts.sum()), -1)
        return NoteVectors(vectors, counts)

    # ---- documents --------------------------------------------------------------------------------------

    def _name(self, file: Path) -> str:
        return file.name if self.root.is_file() else file.relative_to(self.root).as_posix()

    def _documents(self) -> list[tuple[Path, os.stat_result]]:
        """The documents under the root with their stat, checked (KnowledgeError for bad input)."""
        if not self.root.exists():
            raise KnowledgeError(f"--knowledge {self.root}: no such file or folder; give a Markdown or text "
                                 "file, or a folder of them")  # fmt: skip
        if self.root.is_file():
            candidates = [self.root]
        else:
            try:
                candidates = sorted(
                    p for p in self.root.rglob("*")
                    if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES | {PDF_SUFFIX}
                    and not any(part.startswith(".") for part in p.relative_to(self.root).parts)
                )  # fmt: skip
            except OSError as exc:
                raise KnowledgeError(
                    f"cannot list the knowledge folder {self.root}: {exc.strerror}"
                ) from None
            if not candidates:
                raise KnowledgeError(
                    f"the knowledge folder {self.root} holds no documents (.md, .markdown, .txt, .text or "
                    ".pdf); put the documents to answer from there"
                )
            if len(candidates) > MAX_DOCUMENTS:
                raise KnowledgeError(
                    f"the knowledge folder {self.root} holds {len(candidates)} documents; "
                    f"at most {MAX_DOCUMENTS} are indexed: point --knowledge at a sub-folder"
                )
        out = []
        for file in candidates:
            try:
                st = file.stat()
            except OSError as exc:
                raise KnowledgeError(f"cannot read {file}: {exc.strerror}; fix its permissions or remove it "
                                     "from the knowledge folder") from None  # fmt: skip
            if st.st_size > self.max_file_bytes:
                raise KnowledgeError(
                    f"{file} is {st.st_size / 2**20:.1f} MB, over the {self.max_file_bytes / 2**20:.0f} MB "
                    "limit for one document; split it into smaller files"
                )
            out.append((file, st))
        return out

    def _read(self, file: Path) -> str:
        """A document's text (KnowledgeError: unreadable, binary or not UTF-8)."""
        if file.suffix.lower() == PDF_SUFFIX:
            return _read_pdf(file)
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise KnowledgeError(f"cannot read {file}: {exc.strerror}; fix its permissions or remove it "
                                 "from the knowledge folder") from None  # fmt: skip
        if b"\x00" in data[:8192]:
            raise KnowledgeError(f"{file} is a binary file, not text; give Markdown or plain-text documents "
                                 "(convert it, or remove it from the knowledge folder)")  # fmt: skip
        try:
            return data.decode("utf-8-sig")
        except UnicodeDecodeError as exc:
            raise KnowledgeError(
                f"{file} is not UTF-8 text (byte {exc.start}); save it as UTF-8 or remove it from the "
                "knowledge folder"
            ) from None

    # ---- the index --------------------------------------------------------------------------------------

    def _open_cached(self, stamps: Sequence[tuple[str, int, int]]) -> sqlite3.Connection | None:
        """The cached index when it was built from exactly these documents (same mtimes and sizes)."""
        if not self.index.is_file():
            return None
        try:
            db = sqlite3.connect(self.index, check_same_thread=False)
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
            stored = sorted(db.execute("SELECT name, mtime_ns, size FROM files").fetchall())
        except sqlite3.DatabaseError:
            return None  # an older or broken cache: built again
        if meta.get("schema") != str(SCHEMA) or meta.get("chunk_chars") != str(self.chunk_chars):
            db.close()
            return None
        if meta.get("sentence_model") != _sentence_model_installed():  # installed or removed since: rebuilt
            db.close()
            return None
        if stored != sorted(stamps):
            db.close()
            return None
        return db

    def _build(self, files: list[tuple[Path, os.stat_result]], stamps: list[tuple[str, int, int]]) -> None:
        """Index every document into a new file, then move it into place (readers never see half of one)."""
        started = time.perf_counter()
        chunks: list[Chunk] = []
        for file, _ in files:
            chunks.extend(chunk_document(self._name(file), self._read(file), self.chunk_chars))
        if not chunks:
            raise KnowledgeError(
                f"the documents in {self.root} hold no text; put the answers to give in them"
            )
        self.index.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.index.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.unlink(missing_ok=True)
        db = sqlite3.connect(tmp)
        try:
            db.executescript(
                """
                CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT);
                CREATE TABLE files (name TEXT PRIMARY KEY, mtime_ns INTEGER, size INTEGER);
                CREATE TABLE df (term TEXT PRIMARY KEY, n INTEGER) WITHOUT ROWID;
                -- the notes' words as written (lower case) and their terms, with their word vectors in
                -- blobs('vectors'): a question's unknown word is matched to them (knowledge_match)
                CREATE TABLE vocab (word TEXT PRIMARY KEY, term TEXT);
                CREATE TABLE blobs (name TEXT PRIMARY KEY, data BLOB);
                -- terms: the chunk's words as the stemmer reduces them (the query is reduced the same way)
                CREATE VIRTUAL TABLE chunks USING fts5(
                    terms, heading_terms, source UNINDEXED, heading UNINDEXED, text UNINDEXED,
                    tokenize = 'unicode61 remove_diacritics 2'
                );
                """
            )
            df: dict[str, int] = {}
            rows = []
            for chunk in chunks:
                body, head = terms(chunk.text), terms(chunk.heading)
                for term in set(body) | set(head):
                    df[term] = df.get(term, 0) + 1
                rows.append((len(rows) + 1, " ".join(body), " ".join(head), chunk.source, chunk.heading,
                             chunk.text))  # fmt: skip
            # rowid = the chunk's place + 1: its sentences' vectors are found by it
            db.executemany("INSERT INTO chunks(rowid, terms, heading_terms, source, heading, text) "
                           "VALUES (?, ?, ?, ?, ?, ?)", rows)  # fmt: skip
            db.executemany("INSERT INTO df VALUES (?, ?)", df.items())
            surface = _surface_words(chunks)
            db.executemany("INSERT INTO vocab VALUES (?, ?)", surface.items())
            vectors = embed_words(list(surface))
            if vectors is not None:
                db.execute("INSERT INTO blobs VALUES ('vectors', ?)", (vectors.tobytes(),))
            meanings = embed_notes(chunks)
            if meanings is not None:
                counts = np.array([len(sentences(c.text) or [c.text]) for c in chunks], dtype=np.int32)
                db.executemany("INSERT INTO blobs VALUES (?, ?)", [("sentence_vectors", meanings.tobytes()),
                               ("sentence_counts", counts.tobytes())])  # fmt: skip
            db.executemany("INSERT INTO files VALUES (?, ?, ?)", stamps)
            meta = {"schema": SCHEMA, "chunk_chars": self.chunk_chars, "root": str(self.root.resolve()),
                    "built_at": time.time(), "documents": len(files)}  # fmt: skip
            meta["names"] = "|".join(_names(chunks))
            meta["sentence_model"] = _sentence_model_installed()
            db.executemany("INSERT INTO meta VALUES (?, ?)", [(k, str(v)) for k, v in meta.items()])
            db.execute("INSERT INTO chunks(chunks) VALUES ('optimize')")
            db.commit()
        finally:
            db.close()
        os.replace(tmp, self.index)
        log.info("knowledge: indexed %d documents, %d chunks from %s in %.1f s", len(files), len(chunks),
                 self.root, time.perf_counter() - started)  # fmt: skip

    # ---- search -----------------------------------------------------------------------------------------

    def search(self, question: str, limit: int = 4) -> list[Passage]:
        """The chunks that best answer `question` (BM25 over an OR of its distinctive terms), best first."""
        return self.lookup(question, limit)[1]

    def _df(self, wanted: list[str]) -> dict[str, int]:
        marks = ",".join("?" * len(wanted))
        with self._lock:
            rows = self._db.execute(f"SELECT term, n FROM df WHERE term IN ({marks})", wanted).fetchall()
        return dict(rows)

    def query(self, question: str) -> Query:
        """The question's terms, its unknown words matched to the notes' (spelling, then meaning), weights."""
        wanted = list(dict.fromkeys(terms(question)))
        df = self._df(wanted) if wanted else {}
        mapped = self.vocabulary.match(question, df) if len(df) < len(wanted) else {}
        targets = [t for t, _ in mapped.values() if t not in df]
        if targets:
            df.update(self._df(targets))
        weights = {t: idf(df, self._chunks, t) for t in df}
        return Query(tuple(wanted), mapped, weights, idf({}, self._chunks, ""), content_words(question))

    def lookup(self, question: str, limit: int = 4) -> tuple[Query, list[Passage]]:
        """The question as a Query, and the chunks that best answer it (BM25 over an OR of its distinctive
        terms, an unknown word standing for the notes' word it was matched to), best first."""
        q = self.query(question)
        wanted = q.search_terms()
        if not wanted:
            return q, []
        extra = [t for t in intent_terms(question) if t not in wanted]
        df = self._df(wanted + extra)
        # a term most chunks hold (the library's name in its own FAQ) finds everything and tells nothing:
        # it is left out of the query, which also keeps BM25 from scoring most of the index
        rare = {t for t in wanted + extra if 0 < df.get(t, 0) <= max(1, self._chunks // 2)}
        # what a question word asks for counts when the question is about things the notes know: "where is
        # the library" finds the address; "where is the swimming pool" (no pool in them) does not
        known = all(t in df for t in wanted)
        asked_for = [t for t in wanted if t in rare] + [t for t in extra if t in rare and known]
        if self._chunks <= 2:  # a note or two: every term counts
            asked_for = [t for t in wanted + extra if t in df]
        small = self._chunks <= READ_WHOLE_CHUNKS
        if not asked_for and not small:
            return q, []
        with self._lock:
            rows = []
            if asked_for:
                rows = self._db.execute(
                    "SELECT bm25(chunks, 1.0, 2.0), terms, heading_terms, source, heading, text, rowid FROM "
                    "chunks WHERE chunks MATCH ? ORDER BY bm25(chunks, 1.0, 2.0) LIMIT ?",
                    (" OR ".join(f'"{t}"' for t in asked_for), max(limit, RERANK_POOL)),
                ).fetchall()
            if small:  # the rest of the notes, unscored by BM25, for the re-ranker
                seen = {row[-1] for row in rows}
                rest = self._db.execute(
                    "SELECT 0.0, terms, heading_terms, source, heading, text, rowid FROM chunks"
                )
                rows += [row for row in rest.fetchall() if row[-1] not in seen]
        score = self.vocabulary.aligner(q)
        meanings = None if self.notes is None else self.notes.meanings(question)
        passages = []
        for bm25, body, head, source, heading, text, rowid in rows:
            held = set(body.split()) | set(head.split())
            matched = tuple(t for t in wanted if t in held)
            asked = {t for t in extra if t in held}
            if self._chunks > 2:
                distinctive = bool(rare & set(matched)) or (known and bool(rare & asked))
            else:
                distinctive = bool(matched)
            if score is not None:  # how well its best sentence answers, word by word (knowledge_match)
                coverage = max(score(f"{heading} {s}") for s in sentences(text) or [text])
                distinctive = distinctive or coverage >= MIN_UNMATCHED_COVERAGE
            else:
                coverage = q.coverage(held | asked)
            meaning, meant, each = 0.0, False, ()
            if meanings is not None:  # how near its best sentence is in meaning (knowledge_meaning)
                meaning, meant = meanings.best(rowid - 1), meanings.stands_out(rowid - 1)
                each = tuple(float(x) for x in meanings.by_chunk[rowid - 1])
            if bm25 == 0.0 and not (score is not None and coverage >= MIN_UNMATCHED_COVERAGE) and not meant:
                continue  # read whole, not found, and not answering
            passages.append(Passage(source, heading, text, -float(bm25), matched, distinctive or meant,
                                    coverage, meaning, meant, each))  # fmt: skip
        # its meaning first where the notes have sentence vectors, then the words it shares with the question:
        # the right document came first for 28 of 31 answerable questions (27 with both at one weight, 17
        # with the words alone; docs/knowledge.md)
        passages.sort(key=lambda p: (-(p.meaning + RANK_COVERAGE_WEIGHT * p.coverage), -p.score))
        passages = passages[:limit]
        return q, passages

    def weights(self, wanted: list[str]) -> dict[str, float]:
        """Each term's inverse document frequency, log(chunks / chunks holding it): rare terms weigh most."""
        df = self._df(wanted)
        return {t: math.log((self._chunks + 1) / (df.get(t, 0) + 0.5)) for t in wanted}

    def names(self) -> list[str]:
        """The notes' names (people, places, products, codes), most frequent first: for the recogniser."""
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = 'names'").fetchone()
        return [] if row is None or not row[0] else str(row[0]).split("|")

    def stats(self) -> KnowledgeStats:
        """Documents, chunks and when the index was built."""
        with self._lock:
            meta = dict(self._db.execute("SELECT key, value FROM meta").fetchall())
        return KnowledgeStats(str(self.root), str(self.index), int(meta["documents"]), self._chunks,
                              float(meta["built_at"]))  # fmt: skip

    def close(self) -> None:
        """Close the index."""
        with self._lock:
            self._db.close()


# capitalised, but every listener knows them: not names worth telling the recogniser
CALENDAR = frozenset(
    "monday tuesday wednesday thursday friday saturday sunday mondays tuesdays wednesdays thursdays fridays "
    "saturdays sundays january february march april may june july august september october november "
    "december".split()
)


def _names(chunks: list[Chunk], limit: int = 12) -> list[str]:
    """The names a listener would not guess, most frequent first: runs of capitalised words inside a sentence
    ("Marguerite Okafor", "Mill Street"), and words with a digit ("bluefern42")."""
    counts: dict[str, int] = {}
    for chunk in chunks:
        for sentence in sentences(chunk.text):
            run: list[str] = []
            for word in [*words(sentence)[1:], ""]:
                if word[:1].isupper() and word != "I" and word.lower() not in CALENDAR | STOP_WORDS:
                    run.append(word)
                    continue
                if run and len(" ".join(run)) > 2:
                    counts[" ".join(run)] = counts.get(" ".join(run), 0) + 1
                run = []
        for word in chunk.text.split():
            word = word.strip(".,;:!?()\"'")
            if any(c.isdigit() for c in word) and any(c.isalpha() for c in word) and len(word) > 3:
                counts[word] = counts.get(word, 0) + 1
    return sorted(counts, key=lambda w: -counts[w])[:limit]


def _sentence_model_installed() -> str:
    """Whether the sentence vectors' model is installed, as the index's meta stores it."""
    return "1" if bundled_model_dir() is not None else "0"


def _surface_words(chunks: list[Chunk]) -> dict[str, str]:
    """The chunks' content words as written (lower case, letters only, 3 or more) -> their terms."""
    out: dict[str, str] = {}
    for chunk in chunks:
        for word in words(f"{chunk.heading} {chunk.text}"):
            lower = word.lower()
            if len(lower) >= 3 and lower.isalpha() and lower not in STOP_WORDS and lower not in out:
                out[lower] = stem(lower)
    return out


def _read_pdf(file: Path) -> str:
    """A PDF's text with pypdf (an optional package: `pip install pypdf`)."""
    try:
        from pypdf import PdfReader
        from pypdf.errors import PdfReadError
    except ImportError:
        raise KnowledgeError(f"{file} is a PDF: reading PDFs needs `pip install pypdf` (or convert it to "
                             "text, or remove it from the knowledge folder)") from None  # fmt: skip
    try:
        reader = PdfReader(file)
        return "\n\n".join(page.extract_text() or "" for page in reader.pages)
    except (PdfReadError, OSError, ValueError) as exc:
        raise KnowledgeError(f"cannot read the PDF {file}: {exc}; convert it to text or remove it") from None

"""Streamed LLM text → speakable sentences: split deltas as soon as a sentence ends, clean them for TTS."""

from __future__ import annotations

import re
import unicodedata
from urllib.parse import urlsplit

from lipstream.talk.text import has_speakable_content, split_first_clause, split_sentences

# Words that end in a full stop without ending the sentence. Lower-case, without the final dot.
ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs etc approx dept est fig inc ltd co corp gen gov lt mt no jan feb mar apr "
    "jun jul aug sep sept oct nov dec mon tue wed thu fri sat sun".split()
)
# "e.g.", "i.e.", "U.S.", "a.m.": letters separated by dots are one abbreviation.
_DOTTED = re.compile(r"^(?:[A-Za-z]\.){2,}$")
# A sentence ends at . ! ? ; : (maybe repeated, maybe closed by a quote or bracket) followed by whitespace.
_BOUNDARY = re.compile(r"[.!?;:]+[\"'\u201d\u2019)\]]*(?=\s)")
_FENCE = "```"
DEFAULT_MAX_CHARS = 240  # a run-on "sentence" is cut here: TTS time grows with length, the first audio waits


class SentenceStream:
    """Push streamed text deltas, get complete sentences back as soon as they end; `flush()` gives the rest.

    Boundaries: . ! ? ; : followed by whitespace (not after "Dr.", "e.g.", "U.S."; "3.5" has no space), and
    line breaks (LLM lists put one item per line). A fenced code block is kept whole, so `speakable` can
    drop it. With `quick_start`, the reply's first sentence may be cut at its first clause comma (from
    FIRST_CLAUSE_MIN_WORDS words; `text.split_sentences(quick_start=True)` cuts from QUICK_START_MIN_WORDS)
    or before its first phrase, as soon as enough of it has arrived.
    Sentences come back stripped and raw (markdown included): run `speakable` on each before TTS.
    """

    def __init__(self, quick_start: bool = True, max_chars: int = DEFAULT_MAX_CHARS) -> None:
        self.quick_start = quick_start
        self.max_chars = max_chars
        self._buffer = ""
        self._emitted = 0  # pieces given out since the last reset: quick start applies to the first only

    def push(self, delta: str) -> list[str]:
        """Add a text delta; return the sentences it completed (maybe none)."""
        self._buffer += delta
        out: list[str] = []
        while True:
            piece = self._next_piece()
            if piece is None:
                break
            self._emit(piece, out)
        return out

    def flush(self) -> list[str]:
        """End of the reply: return what is left (zero or more pieces) and start over."""
        out: list[str] = []
        rest = self._buffer
        self._buffer = ""
        if rest.strip():
            if self.quick_start and self._emitted == 0:
                for part in split_first_clause(rest.strip(), FIRST_CLAUSE_MIN_WORDS):
                    self._emit(part, out)
            else:
                self._emit(rest, out)
        self._emitted = 0
        return out

    def reset(self) -> None:
        """Drop buffered text (a cancelled reply) and start a new reply."""
        self._buffer = ""
        self._emitted = 0

    @property
    def pending(self) -> str:
        """Text received but not yet given out as a sentence."""
        return self._buffer

    def _emit(self, piece: str, out: list[str]) -> None:
        piece = piece.strip()
        if piece:
            out.append(piece)
            self._emitted += 1

    def _next_piece(self) -> str | None:
        """Cut the first complete piece off the buffer, or return None when none is complete yet."""
        buf = self._buffer
        end = self._find_boundary(buf)
        if end is None and self.quick_start and self._emitted == 0:
            end = self._quick_start_cut(buf)
        if end is None and len(buf) > self.max_chars and not _in_fence(buf, len(buf)):
            end = self._forced_cut(buf)
        if end is None:
            return None
        self._buffer = buf[end:]
        return buf[:end]

    def _find_boundary(self, buf: str) -> int | None:
        candidates = [m.end() for m in _BOUNDARY.finditer(buf) if not _is_abbreviation(buf, m.start())]
        candidates += [m.start() for m in re.finditer(r"\n", buf) if buf[: m.start()].strip()]
        for end in sorted(candidates):
            if buf[:end].strip() and not _in_fence(buf, end):
                return end
        return None

    def _quick_start_cut(self, buf: str) -> int | None:
        return first_phrase_end(buf)

    def _forced_cut(self, buf: str) -> int:
        window = buf[: self.max_chars]
        for pattern in (r"[,\u2013\u2014]\s", r"\s"):
            spots = [m.end() for m in re.finditer(pattern, window)]
            if spots and spots[-1] > self.max_chars // 3:
                return spots[-1]
        return self.max_chars


# Words that open a new phrase: a speaker may pause before them ("and" and "or" often join two words,
# so they are not among them). A small model's first sentence often has no comma ("The fastest way to get
# to the airport is by taking a flight ..."): waiting for its full stop cost 300-700 ms of the first audio
# (benchmarks/conversation_bench.py). After three words or more, the verb "is/are/was/were" and the common
# prepositions also open a phrase one may pause before ("The largest planet | in our solar system is
# Jupiter"): each word the first phrase waits for costs ~25 ms of the model and ~15 ms of the voice on 2
# cores (issue 35: the first word at once); only the reply's first sentence is ever cut there.
PHRASE_STARTERS = frozenset(
    "but with which because while when where who so although though since unless than "
    "is are was were for from during in on at".split()
)
PHRASE_MIN_WORDS = 3
# a number said in this many words or more also opens a phrase after PHRASE_MIN_WORDS words: "The moon is
# about | 2,150 miles away" (its eight spoken words in the first phrase kept Piper busy ~385 ms, issue 35)
NUMBER_PHRASE_DIGITS = 3
# a reply's first sentence leaves at its first clause's comma from this many words (a text given whole to
# `split_sentences`, and every later sentence, only from QUICK_START_MIN_WORDS: each is one synthesis)
FIRST_CLAUSE_MIN_WORDS = 4
# a first sentence with no comma and no phrase-opening word is still cut after this many words: its audio
# starts while the model writes the rest (issue 35: the first word at once)
FIRST_MAX_WORDS = 6
# ... but never right after a word that leans on the next one ("to | the airport", "is | completely set"),
# nor before "is/are/was/were" following a pronoun ("It is what it | is"): the cut moves on a word
LEANING_WORDS = frozenset(
    "a an the to of my your our their his her its this that these those and or but nor is are was were be "
    "been am has have had do does did will would can could should may might must not no very so as by with "
    "in on at for from into than i you we they he she it there any some all each every many much more "
    "most few".split()
)
# a phrase-opening word is not cut from an article, a possessive or a conjunction before it
_BOUND = frozenset("a an the to of my your our their his her its and or nor but".split())
PRONOUNS = frozenset("i you we they he she it that this there what who which one".split())
_VERBS = frozenset("is are was were".split())


def first_phrase_end(buf: str) -> int | None:
    """Where a reply's first sentence (whole, or the part of it received so far) may be cut so that its audio
    starts sooner: after its first clause's comma (from FIRST_CLAUSE_MIN_WORDS words), else before its first
    phrase (`_phrase_cut`); None when there is no such place (yet). The one rule for every text path: the
    conversation's SentenceStream and `split_first_phrase` (speak, `push_text`) both cut here."""
    parts = split_first_clause(buf.strip(), FIRST_CLAUSE_MIN_WORDS)
    if len(parts) < 2:
        return _phrase_cut(buf)
    head = parts[0]
    return buf.index(head) + len(head)


def split_first_phrase(text: str) -> list[str]:
    """A whole text with its first sentence's first phrase cut off (`first_phrase_end`): [head, rest], or
    [text] when the first sentence is short or has no place to cut. The rest keeps its sentences."""
    sentences = split_sentences(text, quick_start=False)
    if not sentences:
        return [text]
    first = sentences[0]
    end = first_phrase_end(first)
    if end is None:
        return [text]
    end += text.index(first)
    head, rest = text[:end].strip(), text[end:].strip()
    if not (has_speakable_content(head) and has_speakable_content(rest)):
        return [text]
    return [head, rest]


def _phrase_cut(buf: str) -> int | None:
    """Where to cut a reply's first sentence before a phrase-opening word or a long number (after at least
    PHRASE_MIN_WORDS words) or after FIRST_MAX_WORDS words, once the next word has fully arrived; None
    when there is no such place yet."""
    words = [(m.start(), _bare(m.group())) for m in re.finditer(r"\S+", buf)]
    spoken = 0  # words spoken before the current one ("210,976" is said in five)
    for index in range(1, len(words) - 1):  # the last word may still be growing
        start, word = words[index]
        before = words[index - 1][1]
        spoken += _spoken_words(before)
        if spoken >= PHRASE_MIN_WORDS and word in PHRASE_STARTERS and before not in _BOUND:
            if not (word in _VERBS and before in PRONOUNS):
                return start
        long_number = _spoken_words(word) >= NUMBER_PHRASE_DIGITS
        if spoken >= PHRASE_MIN_WORDS and long_number and before not in LEANING_WORDS:
            return start
        if spoken >= FIRST_MAX_WORDS and before not in LEANING_WORDS:
            return start
    return None


def _spoken_words(word: str) -> int:
    """About how many words a written word is said in: a number of n digits in about n (its voice's time
    grows with them: "210,976.845" took Piper 0.8 s in a first phrase), anything else in one."""
    return max(1, sum(ch.isdigit() for ch in word))


def _bare(word: str) -> str:
    """A word lower-cased, without the punctuation around it."""
    return word.strip("\"'()[]{}.,;:!?\u201c\u201d\u2018\u2019").lower()


def _in_fence(buf: str, pos: int) -> bool:
    """True when `pos` lies inside an open ``` block (an odd number of fences before it)."""
    return buf.count(_FENCE, 0, pos) % 2 == 1


def _is_abbreviation(buf: str, dot: int) -> bool:
    """True when the '.' at `dot` ends an abbreviation or initial, not a sentence."""
    if buf[dot] != ".":
        return False
    if buf[dot : dot + 3] == "...":
        return False
    start = dot
    while start > 0 and not buf[start - 1].isspace() and buf[start - 1] not in "([\"'":
        start -= 1
    word = buf[start : dot + 1]
    if _DOTTED.match(word):
        return True
    bare = word[:-1]
    if bare.lower() in ABBREVIATIONS:
        return True
    # A single capital letter ("J. Smith") is an initial.
    return len(bare) == 1 and bare.isupper()


_FENCED_BLOCK = re.compile(r"```.*?(?:```|\Z)", re.S)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_IMAGE = re.compile(r"!\[[^\]]*\]\([^)]*\)")
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_URL = re.compile(r"\b(?:https?://|www\.)[^\s<>()\[\]]+", re.I)
_HEADER = re.compile(r"^\s{0,3}#{1,6}\s*", re.M)
_QUOTE = re.compile(r"^\s{0,3}>\s?", re.M)
_BULLET = re.compile(r"^\s*(?:[-*+\u2022]|\d{1,3}[.)])\s+", re.M)
_RULE = re.compile(r"^\s*(?:[-*_=]\s*){3,}$", re.M)
_TABLE_RULE = re.compile(r"^\s*\|?\s*:?-{2,}:?\s*(?:\|\s*:?-{2,}:?\s*)*\|?\s*$", re.M)
_EMPHASIS = re.compile(r"(\*\*|__|~~|\*|_)(?=\S)(.+?)(?<=\S)\1")
_LEFTOVER_MARKUP = re.compile(r"[*#`~|\\<>^]|(?<!\w)_|_(?!\w)")
_SPACES = re.compile(r"[ \t\r\f\v]+")


def speakable(text: str) -> str:
    """What TTS should read of `text`: markdown, code, emoji and URLs removed; "" when nothing is left."""
    text = _FENCED_BLOCK.sub(" ", text)  # code is not read aloud
    text = _INLINE_CODE.sub(" ", text)
    text = _IMAGE.sub(" ", text)
    text = _LINK.sub(r"\1", text)
    text = _URL.sub(_url_host, text)
    text = _TABLE_RULE.sub(" ", text)
    text = _RULE.sub(" ", text)
    text = _HEADER.sub("", text)
    text = _QUOTE.sub("", text)
    text = _BULLET.sub("", text)
    for _ in range(2):  # nested emphasis (***x***)
        text = _EMPHASIS.sub(r"\2", text)
    text = _drop_symbols(text)
    text = _LEFTOVER_MARKUP.sub(" ", text)
    lines = (_SPACES.sub(" ", line).strip() for line in text.splitlines())
    text = " ".join(line for line in lines if line)
    text = re.sub(r"\s+([,.!?;:])", r"\1", text)
    text = re.sub(r"([,;:])(?:\s*[,;:])+", r"\1", text)
    text = text.strip(" ,;:")
    return text if has_speakable_content(text) else ""


def _url_host(match: re.Match[str]) -> str:
    """A URL is read as its host ("example.com"), never as its path and query."""
    url = match.group(0).rstrip(".,;:!?")
    trail = match.group(0)[len(url) :]
    if not url.lower().startswith("http"):
        url = "http://" + url
    host = urlsplit(url).hostname or ""
    if host.startswith("www."):
        host = host[4:]
    return host + trail


def _drop_symbols(text: str) -> str:
    """Remove emoji, pictographs, joiners and variation selectors; keep letters and punctuation."""
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        # So: emoji and pictographs; Sk: modifier symbols, skin tones among them.
        if cat in ("So", "Sk", "Cs", "Co", "Cn") or ch in "\u200d\ufe0e\ufe0f\u20e3":
            kept.append(" ")
        else:
            kept.append(ch)
    return "".join(kept)

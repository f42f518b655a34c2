"""Text for the knowledge index: documents cut into chunks under their headings, and words reduced to terms.

The index and the reply guard share one notion of a term (lower case, the Porter2 stemmer, stop
words out), so "opens" in a question finds "open" in a document and a reply's "hours" matches a passage's.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

WORD = re.compile(r"[^\W_]+(?:['’-][^\W_]+)*", re.UNICODE)
DIGITS_AND_LETTERS = re.compile(r"(?<=\d)(?=[^\W\d_])|(?<=[^\W\d_])(?=\d)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'(\[]?[A-Z0-9])")
# function words and the chatter around a question: what is left are the words that find a passage
STOP_WORDS = frozenset(
    """
    a about above after again against all am an and any are aren't as at be because been before being below
    between both but by can can't cannot could couldn't did didn't do does doesn't doing don't down during
    each
    few for from further had hadn't has hasn't have haven't having he he'd he'll he's her here here's hers
    herself him himself his how how's i i'd i'll i'm i've if in into is isn't it it's its itself let's me more
    most mustn't my myself no nor not of off on once only or other ought our ours ourselves out over own same
    shan't she she'd she'll she's should shouldn't so some such than that that's the their theirs them
    themselves then there there's these they they'd they'll they're they've this those through to too under
    until up very was wasn't we we'd we'll we're we've were weren't what what's when when's where where's
    which
    while who who's whom why why's will with won't would wouldn't you you'd you'll you're you've your yours
    yourself yourselves
    tell please could know want like get got go going say said also just really much many thing things
    hello hi hey thanks thank okay ok yes yeah well um uh oh sorry excuse anything something everything
    sure certainly absolutely course indeed alright
    """.split()
)

# what a question word asks for: "Where is the library?" is about an address even when "library" is in every
# section of the library's own notes (the words are stemmed when used)
INTENTS = {
    "where": "address located location street",
    "when": "open hours close time days",
    "much": "cost price fee",
    "call": "phone number",
    "phone": "call number",
    "contact": "phone email address",
}


@dataclass(frozen=True)
class Chunk:
    """A piece of a document small enough for the prompt, with where it came from."""

    source: str  # the document's path relative to the knowledge root (a name a user knows)
    heading: str  # the heading path above it: "Clinic > Opening hours" ("" when the document has none)
    text: str


def stem(word: str) -> str:
    """A word's term: lower case, the possessive cut, then the Porter2 (Snowball English) stem, so "cancel"
    finds "cancellation" and "opens" finds "open"."""
    w = word.lower().replace("’", "'")
    if w.endswith("'s"):
        w = w[:-2]
    return _porter2(w)


@functools.lru_cache(maxsize=65536)  # why: a text's words repeat; a stem is a pure function of the word
def _porter2(word: str) -> str:
    return _english_stemmer().stemWord(word)


@functools.lru_cache(maxsize=1)
def _english_stemmer():  # noqa: ANN202 - snowballstemmer has no type for it
    import snowballstemmer

    return snowballstemmer.stemmer("english")


def words(text: str) -> list[str]:
    """The words of `text`, in order; a number glued to letters is a word of its own ("12pm": 12, pm), so a
    reply's "9:45am" shows the numbers it states."""
    return WORD.findall(DIGITS_AND_LETTERS.sub(" ", text))


def terms(text: str) -> list[str]:
    """The content terms of `text`, in order, repeats kept (stop words out, each word stemmed); a hyphenated
    word gives its joined form and its parts ("Wi-Fi": wifi, wi, fi), so either spelling finds the other."""
    out: list[str] = []
    for word in words(text):
        if word.lower().replace("’", "'") in STOP_WORDS:
            continue
        if "-" in word:
            out.append(stem(word.replace("-", "")))
            out.extend(stem(part) for part in word.split("-") if part.lower() not in STOP_WORDS)
        else:
            out.append(stem(word))
    return out


def intent_terms(text: str) -> list[str]:
    """Terms a question's question words ask for ("where": address, location, street...), beyond its own."""
    out: list[str] = []
    for word in words(text):
        out.extend(stem(w) for w in INTENTS.get(word.lower(), "").split())
    return list(dict.fromkeys(out))


def sentences(text: str) -> list[str]:
    """`text` cut into sentences (a line of its own, such as a list item, is one too)."""
    out: list[str] = []
    for line in text.splitlines():
        line = re.sub(r"^\s*(?:[-*+]|\d+[.)])\s+", "", line).strip()
        out.extend(piece.strip() for piece in SENTENCE_END.split(line) if piece.strip())
    return out


def chunk_document(source: str, text: str, max_chars: int = 700) -> list[Chunk]:
    """Cut a Markdown or plain-text document into chunks of whole paragraphs (at most `max_chars` each, but
    a longer paragraph is cut at sentence ends), each under the heading path it sits in."""
    chunks: list[Chunk] = []
    path: list[tuple[int, str]] = []  # (level, title) of the headings above
    paragraph: list[str] = []
    pieces: list[str] = []

    def heading() -> str:
        return " > ".join(title for _, title in path)

    def end_paragraph() -> None:
        if paragraph:
            pieces.extend(_fit(" ".join(paragraph) if not _is_list(paragraph) else "\n".join(paragraph),
                               max_chars))  # fmt: skip
            paragraph.clear()

    def end_section() -> None:
        end_paragraph()
        current = ""
        for piece in pieces:
            if current and len(current) + 2 + len(piece) > max_chars:
                chunks.append(Chunk(source, heading(), current))
                current = ""
            current = f"{current}\n\n{piece}" if current else piece
        if current:
            chunks.append(Chunk(source, heading(), current))
        pieces.clear()

    for raw in text.splitlines():
        line = raw.rstrip()
        match = HEADING.match(line)
        if match:
            end_section()
            level = len(match.group(1))
            path = [(lv, t) for lv, t in path if lv < level] + [(level, match.group(2).strip())]
        elif not line.strip():
            end_paragraph()
        else:
            paragraph.append(line.strip())
    end_section()
    return chunks


def _is_list(lines: list[str]) -> bool:
    return len(lines) > 1 and all(re.match(r"^(?:[-*+]|\d+[.)])\s", line) for line in lines)


def _fit(paragraph: str, max_chars: int) -> list[str]:
    """A paragraph as pieces of at most `max_chars` (cut at sentence ends, else at words)."""
    if len(paragraph) <= max_chars:
        return [paragraph]
    pieces: list[str] = []
    current = ""
    for sentence in SENTENCE_END.split(paragraph):
        while len(sentence) > max_chars:  # one sentence longer than a chunk: cut at a space
            cut = sentence.rfind(" ", 0, max_chars)
            cut = cut if cut > 0 else max_chars
            if current:
                pieces.append(current)
                current = ""
            pieces.append(sentence[:cut].strip())
            sentence = sentence[cut:].strip()
        if current and len(current) + 1 + len(sentence) > max_chars:
            pieces.append(current)
            current = ""
        current = f"{current} {sentence}".strip()
    if current:
        pieces.append(current)
    return pieces

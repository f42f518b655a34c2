"""Text checks shared by the TTS voices: anything to say, short enough, where sentences end."""

from __future__ import annotations

import re

from lipstream.errors import SpeechError

# About 5 minutes of speech at ~15 characters per second. Longer text belongs in several requests:
# it keeps one utterance's audio, phoneme list and render within memory bounds the render path expects.
MAX_TEXT_CHARS = 5000

_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+|\n{2,}")


def bare_word(word: str) -> str:
    """A word for comparison: lower case, letters, digits and apostrophes only ("Library," -> "library")."""
    return re.sub(r"[^a-z0-9']", "", word.lower())


def has_speakable_content(text: str) -> bool:
    """True when the text holds at least one letter or digit (punctuation alone would be read out by name)."""
    return any(ch.isalnum() for ch in text)


def check_text(text: str) -> str:
    """Return the text stripped, or raise SpeechError when it is empty, unspeakable or too long."""
    if not isinstance(text, str):
        raise SpeechError(f"text must be a string, got {type(text).__name__}")
    stripped = text.strip()
    if not has_speakable_content(stripped):
        raise SpeechError("text has nothing to speak (empty or only punctuation/whitespace); give some words")
    if len(stripped) > MAX_TEXT_CHARS:
        raise SpeechError(
            f"text is {len(stripped)} characters, over the limit of {MAX_TEXT_CHARS}; split it into parts"
        )
    return stripped


def split_sentences(text: str, quick_start: bool = True) -> list[str]:
    """Split checked text into sentences that each have something to speak.

    With `quick_start`, a long first sentence is split after its first clause ("Good evening, | and
    welcome ..."): synthesis time grows with the sentence, so the first audio is ready sooner, and a
    clause boundary is where a speaker pauses anyway."""
    parts = (part.strip() for part in _SENTENCE_END.split(text))
    sentences = [piece for part in parts if has_speakable_content(part) for piece in _cap_length(part)]
    if quick_start and sentences:
        sentences[:1] = split_first_clause(sentences[0])
    return sentences


MAX_PIECE_CHARS = 200  # about 10 s of speech: one synthesis job's time and memory stay small


def _cap_length(sentence: str) -> list[str]:
    """A run-on sentence in pieces of at most MAX_PIECE_CHARS, cut after a comma when there is one, else
    between words (4000 characters with no full stop were one 60 s, 3.5 GB synthesis job)."""
    pieces: list[str] = []
    rest = sentence
    while len(rest) > MAX_PIECE_CHARS:
        window = rest[:MAX_PIECE_CHARS]
        cut = max(window.rfind(", "), window.rfind("; "))
        cut = cut + 1 if cut > MAX_PIECE_CHARS // 3 else window.rfind(" ")
        if cut <= 0:
            cut = MAX_PIECE_CHARS  # one enormous word: cut it anyway
        head, rest = rest[:cut].strip(), rest[cut:].strip()
        if has_speakable_content(head):
            pieces.append(head)
    if has_speakable_content(rest):
        pieces.append(rest)
    return pieces


_CLAUSE_END = re.compile(r"(?<=[,;:\u2013\u2014])\s+")
QUICK_START_MIN_WORDS = 8  # shorter first sentences are quick to synthesise whole


def split_first_clause(sentence: str, min_words: int = QUICK_START_MIN_WORDS) -> list[str]:
    """A sentence of at least `min_words` words cut after its first clause (two pieces), else the sentence
    alone."""
    if len(sentence.split()) < min_words:
        return [sentence]
    pieces = _CLAUSE_END.split(sentence, maxsplit=1)
    if len(pieces) < 2 or len(pieces[0].split()) < 2 or not has_speakable_content(pieces[1]):
        return [sentence]
    return pieces

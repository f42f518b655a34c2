"""Streamed text → sentences for TTS, and what of a reply is speakable."""

from __future__ import annotations

import pytest

from lipstream.talk.text import split_sentences
from lipstream.talk.voices.sentences import SentenceStream, speakable


def _stream(text: str, step: int = 3, quick_start: bool = True) -> list[str]:
    stream = SentenceStream(quick_start=quick_start)
    out: list[str] = []
    for i in range(0, len(text), step):
        out += stream.push(text[i : i + step])
    return out + stream.flush()


def test_sentences_come_out_as_soon_as_they_end() -> None:
    stream = SentenceStream()
    assert stream.push("Hello there") == []
    assert stream.push("! How") == ["Hello there!"]
    assert stream.push(" are you?") == []  # the "?" may still be followed by more ("?!")
    assert stream.push(" Fine") == ["How are you?"]
    assert stream.flush() == ["Fine"]
    assert stream.flush() == []


@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_abbreviations_numbers_and_punctuation(step: int) -> None:
    text = (
        "Hi! Dr. Smith paid 3.5 dollars in the U.S. yesterday, e.g. for tea. Is it right? "
        "Well, I think so; maybe: yes.\nJ. R. Tolkien wrote it... Really?!"
    )
    assert _stream(text, step) == [
        "Hi!",
        "Dr. Smith paid 3.5 dollars in the U.S. yesterday, e.g. for tea.",
        "Is it right?",
        "Well, I think so;",
        "maybe:",
        "yes.",
        "J. R. Tolkien wrote it...",
        "Really?!",
    ]


def test_quick_start_matches_split_sentences() -> None:
    text = "Good evening everyone, and welcome to the late news from the city tonight. Short one. Then, more."
    assert _stream(text, 4) == split_sentences(text, quick_start=True)
    assert _stream(text, 4, quick_start=False) == split_sentences(text, quick_start=False)
    # The first clause leaves as soon as the sentence has enough words, before the sentence ends.
    stream = SentenceStream()
    assert stream.push("Good evening everyone,") == []  # 3 words: maybe a short sentence
    assert stream.push(" and") == ["Good evening everyone,"]
    # Only the reply's first sentence is cut.
    stream = SentenceStream()
    assert _stream("Yes. Good evening everyone, and welcome to the late news from town.") == [
        "Yes.",
        "Good evening everyone, and welcome to the late news from town.",
    ]


def test_reset_starts_a_new_reply() -> None:
    stream = SentenceStream()
    stream.push("Half a sent")
    stream.reset()
    assert stream.pending == ""
    assert stream.push("New reply. ") == ["New reply."]


def test_lists_code_blocks_and_run_on_text() -> None:
    text = "Steps:\n- boil water\n- add tea\n```python\nprint(1)\n\nx = 2\n```\nDone"
    fence = "```python\nprint(1)\n\nx = 2\n```"
    assert _stream(text) == ["Steps:", "- boil water", "- add tea", fence, "Done"]
    run_on = "and then " * 60
    pieces = _stream(run_on, 7)
    assert len(pieces) > 1 and all(len(p) <= 240 for p in pieces)
    assert " ".join(pieces).split() == run_on.split()


@pytest.mark.parametrize(
    ("raw", "spoken"),
    [
        ("**Bold** and *it* and __u__ and ~~gone~~ words.", "Bold and it and u and gone words."),
        ("## Header\nText", "Header Text"),
        ("- item one\n- item two", "item one item two"),
        ("1. first\n2) second", "first second"),
        ("See [the docs](http://x.org/a) now.", "See the docs now."),
        ("Visit https://www.example.com/path?q=1.", "Visit example.com."),
        ("Run `pip install x` first.", "Run first."),
        ("Great job 😀👍🏽 really ✨!", "Great job really!"),
        ("> quoted wisdom", "quoted wisdom"),
        ("snake_case stays", "snake_case stays"),
        ("Price: $5 or 3 + 4 = 7 (50%).", "Price: $5 or 3 + 4 = 7 (50%)."),
        ("| a | b |\n|---|---|\n| 1 | 2 |", "a b 1 2"),
    ],
)
def test_speakable_cleans_markdown_emoji_urls(raw: str, spoken: str) -> None:
    assert speakable(raw) == spoken


@pytest.mark.parametrize(
    "raw", ["```python\nprint(1)\n```", "😀🎉", "---", "`code`", "**", "", "   ", "![img](a.png)"]
)
def test_speakable_is_empty_when_nothing_to_say(raw: str) -> None:
    assert speakable(raw) == ""


def _word_by_word(text: str) -> list[str]:
    """The pieces a SentenceStream gives for `text` streamed a word at a time, as a model writes it."""
    stream = SentenceStream()
    pieces: list[str] = []
    for word in text.split():
        pieces += stream.push(word + " ")
    return pieces + stream.flush()


def test_a_first_sentence_without_commas_is_cut_before_a_phrase() -> None:
    text = "The weather in the city today is mostly sunny and warm with a light breeze. Then rain."
    assert _word_by_word(text) == [
        "The weather in the city today",
        "is mostly sunny and warm with a light breeze.",
        "Then rain.",
    ]


@pytest.mark.parametrize(
    ("text", "first"),
    [
        ("The fastest way to get to the airport is by train.", "The fastest way to get to the airport"),
        ("I'm afraid I don't have any ideas for a long journey.", "I'm afraid I don't have any ideas"),
        ("The largest planet in our solar system is Jupiter.", "The largest planet"),
        ("Yes it is.", "Yes it is."),  # short: never cut
        ("It is what it is in the end of the day.", "It is what it is"),  # not before a pronoun's verb
        ("Boil the egg until it is completely set.", "Boil the egg until it is completely set."),
        ("The moon is 384,400 kilometres away from us.", "The moon is 384,400"),  # a number is said long
        ("The moon is about 2,150 miles away from the Earth.", "The moon is about"),  # ... so opens a phrase
        ("It takes about 20 minutes by train from here.", "It takes about 20 minutes"),  # two digits: no
    ],
)
def test_the_first_phrase_ends_before_a_verb_or_preposition_after_three_words(text: str, first: str) -> None:
    pieces = _word_by_word(text)
    assert pieces[0] == first and " ".join(pieces) == text


def test_a_long_first_clause_is_cut_after_six_words_not_after_a_leaning_word() -> None:
    text = "Many large old oak trees grow slowly and quietly near rivers and lakes. Then rain."
    pieces = _word_by_word(text)
    assert pieces[0] == "Many large old oak trees grow"
    assert _word_by_word("Yes the big old dog and the cat run.")[0] == "Yes the big old dog and the cat run."
    assert " ".join(pieces) == text

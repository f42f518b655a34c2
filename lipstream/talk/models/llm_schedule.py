"""What the answers' context decodes next when several conversations want the model (issue 49 items 2, 3).

On a CPU a decode costs in proportion to the tokens in it (measured on the 2-core box, one thread, SmolLM2
135M: a token written ≈ 15 ms for one sequence, 29 for two, 52 for four; a prompt token read ≈ 6 ms, in chunks
of 16 as of 256), so batching saves little and the order is what counts. Work goes in order of need:

1. of the answers not past their first phrase (cut where the speaker cuts it), the one nearest to it (its
   prompt left to read and its first phrase left to write, costed as above) gets the step: a listener waits
   for each, and the shortest job first has the fewest waiting longest (writing all first phrases side by
   side had every one of them late);
2. an answer past its first phrase decodes every step while no one else needs the model, and otherwise one
   token every `LATER_PACE_S` (still faster than speech: playback is seconds behind its later sentences);
3. a read-ahead (a prompt read while its user still speaks) only when no answer waits for its first phrase.

Measured before and after with `python -m benchmarks conversations` (docs/benchmarks.md, "Several
conversations at once"). Pure logic (no llama.cpp, no clock of its own): tests/test_llm_schedule.py.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from lipstream.talk.models.llm_sampling import SamplingConfig
from lipstream.talk.voices.sentences import SentenceStream

# an answer's tokens until its first phrase is surely written, if no cut came sooner: 4 answers asked at once
# kept the fourth 0.9-1.1 s from its first token behind the others' 16 tokens each, where their first phrases
# were out after 6-10 (`python -m benchmarks conversations`, 4 at once, this Xeon)
FIRST_PHRASE_TOKENS = 16
PROMPT_CHUNK = 32  # a prompt's tokens in one step (≈ 200 ms on one core): an answer asked meanwhile waits
READ_TOKEN_MS = 6.0  # a prompt token's share of a decode, one core (measured, see above)
WRITE_TOKEN_MS = 15.0  # a written token's decode
READ_AHEAD_CHUNK = 16  # a read-ahead's tokens in one step (≈ 100 ms)
LATER_PACE_S = 0.15  # one token of a later sentence per this, while others need the model (≈ 5 words/s)


@dataclass(eq=False)
class Job:
    """An answer to write (with `sampling` None: a prompt to read ahead) in a sequence of the context."""

    prompt: list[int]
    max_tokens: int
    sampling: SamplingConfig | None
    emit: Callable[[str], None]  # a piece of the answer's text (called on the decoding thread)
    finish: Callable[[BaseException | None, int], None]  # the end: the error if any, prompt tokens read
    cancel: threading.Event
    seed: int = 0
    slot: int | None = None
    read: int = 0  # prompt tokens in the sequence's cache
    cached: int = 0  # ... of them found there when it was seated (not read again)
    written: list[int] = field(default_factory=list)
    last_step: float = 0.0  # when it last decoded
    pending: bytes = b""  # the end of a character split across tokens
    rng: np.random.Generator | None = None
    # the answer's text cut as the speaker cuts it: urgent until its first phrase is out (`wrote`)
    phrases: SentenceStream = field(default_factory=SentenceStream)
    phrase_written: bool = False

    def wrote(self, text: str) -> None:
        """A piece of the answer's text was written (its first phrase may now be complete)."""
        if not self.phrase_written and self.phrases.push(text):
            self.phrase_written = True

    @property
    def is_answer(self) -> bool:
        """It writes an answer (not only reads ahead)."""
        return self.sampling is not None

    @property
    def left(self) -> int:
        """Prompt tokens not read yet."""
        return len(self.prompt) - self.read

    @property
    def urgent(self) -> bool:
        """An answer whose first phrase is not written yet (its prompt included): not cut where the speaker
        cuts it (SentenceStream), nor FIRST_PHRASE_TOKENS long."""
        return self.is_answer and (
            self.left > 0 or (not self.phrase_written and len(self.written) < FIRST_PHRASE_TOKENS)
        )


@dataclass(frozen=True)
class Entry:
    """A job's tokens in a decode; `logits`: its last token's logits pick the job's next token."""

    job: Job
    tokens: list[int]
    logits: bool


def plan_step(jobs: list[Job], now: float) -> list[Entry]:
    """The next decode for `jobs` (each holding a sequence) at time `now`, in order of need; empty when no
    job has anything to decode."""
    answers = [job for job in jobs if job.is_answer]
    urgent = [job for job in answers if job.urgent]
    entries = []
    if urgent:
        nearest = min(urgent, key=to_first_phrase_ms)  # the first of equals: the oldest
        entries.append(_read(nearest, PROMPT_CHUNK) if nearest.left else _next(nearest))
    else:
        ahead = [job for job in jobs if not job.is_answer and job.left > 0]
        entries += [_read(job, READ_AHEAD_CHUNK) for job in ahead[:1]]
    busy = bool(entries)
    later = [job for job in answers if not job.urgent]
    entries += [_next(job) for job in later if not busy or now - job.last_step >= LATER_PACE_S]
    return entries


def to_first_phrase_ms(job: Job) -> float:
    """The decode time an answer needs until its first phrase is written: its prompt left, its words."""
    return job.left * READ_TOKEN_MS + max(0, FIRST_PHRASE_TOKENS - len(job.written)) * WRITE_TOKEN_MS


def _next(job: Job) -> Entry:
    """An answer's last written token, whose logits pick the next."""
    return Entry(job, job.written[-1:], True)


def _read(job: Job, chunk: int) -> Entry:
    """The job's next `chunk` prompt tokens; the logits of the last one when it ends an answer's prompt."""
    tokens = job.prompt[job.read : job.read + chunk]
    return Entry(job, tokens, job.is_answer and job.read + len(tokens) == len(job.prompt))

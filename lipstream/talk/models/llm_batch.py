"""Several answers written at once in one llama.cpp context (issue 49 item 3).

Each answer is a sequence of its own in a context of `slots` sequences; one thread decodes them, the tokens
`llm_schedule.plan_step` picks (every first phrase being written, a chunk of a waiting prompt, later sentences
at a pace) in one batch a step. Before, one answer was written to its end while a new one waited.

Each sequence keeps its tokens in the cache after its answer: the next request takes the free sequence whose
cache shares the longest start with its prompt (a conversation's next turn, or its own read-ahead), so only
the new tokens are read.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import numpy as np

from lipstream.talk.models.llm_sampling import next_token
from lipstream.talk.models.llm_schedule import Entry, Job, plan_step

SLOTS = 4  # answers written at once (a fifth waits for a sequence); the server seats fewer (docs/scaling.md)
STEP_TOKENS = 64  # the most tokens in one decode (plan_step's chunks, plus one token per answer)
READ_AHEAD_TAIL = 32  # a read-ahead's last tokens a request that goes on from it may differ in
# a start of the prompt this many tokens longer in another sequence (busy or free) is copied from there, not
# read again: a knowledge turn's instructions and rule (~100 tokens, ~0.7 s on one core) are in the sequence
# of the conversation's own read-ahead, reading the notes, when the answer is asked and seated beside it
MIN_COPY_TOKENS = 16


class BatchedWriter:
    """The answers' context of a loaded `Llama`: `submit` a job from any thread; one thread decodes."""

    def __init__(self, llama: Any, slots: int = SLOTS, context_tokens: int = 2048) -> None:
        import llama_cpp
        from llama_cpp import _internals

        self._lib = llama_cpp
        params = type(llama.context_params).from_buffer_copy(llama.context_params)
        params.n_seq_max = slots
        params.n_ctx = slots * context_tokens  # each sequence its own `context_tokens`
        params.kv_unified = False
        params.n_batch = params.n_ubatch = STEP_TOKENS
        self._ctx = _internals.LlamaContext(model=llama._model, params=params, verbose=False)
        self._batch = _internals.LlamaBatch(n_tokens=STEP_TOKENS, embd=0, n_seq_max=1, verbose=False)
        self._memory = llama_cpp.llama_get_memory(self._ctx.ctx)
        self._llama = llama
        self._vocab = llama.n_vocab()
        self._end_tokens = {llama.token_eos(), *_im_end(llama)}
        self.context_tokens = context_tokens
        self._cached: list[list[int]] = [[] for _ in range(slots)]  # each sequence's tokens in the cache
        self._used = [0.0] * slots  # when each sequence last served (the least recent is reused first)
        self._jobs: list[Job] = []  # holding a sequence
        self._waiting: list[Job] = []  # for a sequence
        self._inbox: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="llm-batch", daemon=True)
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue `job`; its `emit` and `finish` are called from the decoding thread."""
        self._inbox.put(job)

    def close(self) -> None:
        """Finish the thread (jobs still queued end with an error) and free the context."""
        self._inbox.put(None)
        self._thread.join()
        self._batch.close()
        self._ctx.close()

    # -- the decoding thread ---------------------------------------------------------------------------------

    def _run(self) -> None:
        entries: list[Entry] = []
        while self._take(block=not entries):
            self._drop_cancelled()
            self._seat_waiting()
            entries = plan_step(self._jobs, time.monotonic())
            if not entries:
                continue
            try:
                self._step(entries)
            except Exception as exc:  # a failed decode ends the jobs in it, never the thread
                for entry in entries:
                    self._end(entry.job, exc)
        for job in [*self._jobs, *self._waiting]:
            self._end(job, RuntimeError("the language model is shutting down"))

    def _take(self, block: bool) -> bool:
        """Move submitted jobs to the waiting list; False once `close` was called."""
        try:
            item = self._inbox.get(block=block)
        except queue.Empty:
            return True
        while item is not None:
            self._waiting.append(item)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return True
        return False

    def _drop_cancelled(self) -> None:
        """End the jobs whose caller went away."""
        for job in [*self._jobs, *self._waiting]:
            if job.cancel.is_set():
                self._end(job, None)

    def _seat_waiting(self) -> None:
        """Give sequences to waiting jobs, answers first: each the free sequence whose cache shares the
        longest start with its prompt (the least recently used of equals), or the sequence of a running
        read-ahead it goes on from, which ends there: a read whose start its prompt shares but for its last
        words (a partial transcript's end may differ from the final's, and the words at the notes' end
        tokenize differently when the question follows them), more of it than any free sequence holds. An
        answer with no free sequence ends a read-ahead to take its place."""
        for job in sorted(self._waiting, key=lambda j: not j.is_answer):
            busy = {seated.slot for seated in self._jobs}
            free = [slot for slot in range(len(self._cached)) if slot not in busy]
            # an answer reads its last prompt token again when all is cached: its logits start the answer
            limit = len(job.prompt) - 1 if job.is_answer else len(job.prompt)
            shared = {slot: _shared_start(self._cached[slot], job.prompt, limit) for slot in free}
            ahead = [seated for seated in self._jobs if not seated.is_answer]
            held = max(shared.values(), default=0)
            taken = next((r for r in ahead if self._goes_on_from(job, limit, r, held)), None)
            if taken is None and not free and job.is_answer and ahead:
                taken = ahead[0]  # room for an answer
            if taken is not None:
                assert taken.slot is not None
                self._end(taken, None)
                free.append(taken.slot)
                shared[taken.slot] = _shared_start(self._cached[taken.slot], job.prompt, limit)
            if not free:
                break
            slot = max(free, key=lambda s: (shared[s], -self._used[s]))
            shared[slot] = self._copy_longest_start(slot, shared[slot], job.prompt, limit)
            self._lib.llama_memory_seq_rm(self._memory, slot, shared[slot], -1)
            del self._cached[slot][shared[slot] :]
            job.slot, job.read, job.cached = slot, shared[slot], shared[slot]
            job.rng = np.random.default_rng(job.seed)
            self._waiting.remove(job)
            self._jobs.append(job)
            if job.left == 0:  # a read-ahead of what the cache already holds
                self._end(job, None)

    def _copy_longest_start(self, slot: int, held: int, prompt: list[int], limit: int) -> int:
        """Copy into `slot` (holding `held` tokens of `prompt`) the sequence whose cache shares the longest
        start with the prompt's first `limit` tokens, when that is MIN_COPY_TOKENS longer; the tokens now
        shared. Sequences live in streams of their own (kv_unified off), so the whole stream is copied (a
        memory copy of a few ms, against ~7 ms a token read on one core), then cut where the prompt
        differs."""
        others = (s for s in range(len(self._cached)) if s != slot)
        starts = {s: _shared_start(self._cached[s], prompt, limit) for s in others}
        source = max(starts, key=starts.__getitem__, default=None)
        if source is None or starts[source] < held + MIN_COPY_TOKENS:
            return held
        start = starts[source]
        self._lib.llama_memory_seq_rm(self._memory, slot, -1, -1)
        self._lib.llama_memory_seq_cp(self._memory, source, slot, -1, -1)
        self._cached[slot] = self._cached[source][:start]
        return start

    def _goes_on_from(self, job: Job, limit: int, ahead: Job, held: int) -> bool:
        """`job`'s prompt (its first `limit` tokens) goes on from the read-ahead `ahead`: it holds all that
        the read-ahead was asked to read but its last READ_AHEAD_TAIL tokens, and shares more of what was read
        than the `held` tokens a free sequence holds. Measured against the whole read asked for, not the part
        read so far: a read just begun is mostly the system prompt, which another conversation's answer
        shares too (it then ended that conversation's read of its notes, 650 tokens, after a few)."""
        assert ahead.slot is not None
        meant = _shared_start(ahead.prompt, job.prompt, limit)
        shared = min(meant, len(self._cached[ahead.slot]))  # what it read is the start of its prompt
        return shared > held and meant >= len(ahead.prompt) - READ_AHEAD_TAIL

    def _step(self, entries: list[Entry]) -> None:
        """Decode the entries in one batch, then pick each answer's next token where its logits came."""
        batch = self._batch.batch
        n = 0
        rows: list[tuple[Job, int]] = []
        for entry in entries:
            slot = entry.job.slot
            assert slot is not None
            start = len(self._cached[slot])
            for offset, token in enumerate(entry.tokens):
                batch.token[n] = token
                batch.pos[n] = start + offset
                batch.seq_id[n][0] = slot
                batch.n_seq_id[n] = 1
                batch.logits[n] = entry.logits and offset == len(entry.tokens) - 1
                n += 1
            if entry.logits:
                rows.append((entry.job, n - 1))
        batch.n_tokens = n
        self._ctx.decode(self._batch)
        now = time.monotonic()
        for entry in entries:
            job = entry.job
            assert job.slot is not None
            self._cached[job.slot].extend(entry.tokens)
            self._used[job.slot] = job.last_step = now
            if job.left > 0:
                job.read += len(entry.tokens)
                if job.left == 0 and not job.is_answer:
                    self._end(job, None)
        for job, row in rows:
            self._write(job, row)

    def _write(self, job: Job, row: int) -> None:
        """Pick the job's next token from its logits row; emit its text or end the answer."""
        assert job.sampling is not None and job.rng is not None and job.slot is not None
        logits = np.ctypeslib.as_array(self._ctx.get_logits_ith(row), shape=(self._vocab,))
        token = next_token(logits, job.written, job.sampling, job.rng)
        if token in self._end_tokens or job.cancel.is_set():
            self._end(job, None)
            return
        job.written.append(token)
        job.pending += self._llama.detokenize([token], prev_tokens=job.written[:-1])
        text, job.pending = _complete_utf8(job.pending)
        job.wrote(text)
        if text:
            job.emit(text)
        if len(job.written) >= job.max_tokens or len(self._cached[job.slot]) >= self.context_tokens - 1:
            self._end(job, None)

    def _end(self, job: Job, error: BaseException | None) -> None:
        """Take the job off the lists and report its end (once)."""
        if job in self._jobs:
            self._jobs.remove(job)
        elif job in self._waiting:
            self._waiting.remove(job)
        else:
            return
        job.finish(error, job.read)


def _shared_start(cached: list[int], prompt: list[int], limit: int) -> int:
    """How many first tokens `cached` and `prompt[:limit]` share."""
    count = 0
    for a, b in zip(cached, prompt[:limit], strict=False):
        if a != b:
            break
        count += 1
    return count


def _complete_utf8(data: bytes) -> tuple[str, bytes]:
    """The text of `data`'s complete characters, and the bytes of a character cut at its end."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8"), data[cut:]
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", "replace"), b""


def _im_end(llama: Any) -> list[int]:
    """The chat template's end-of-message token, when the vocabulary has one."""
    tokens = llama.tokenize(b"<|im_end|>", add_bos=False, special=True)
    return tokens[:1] if len(tokens) == 1 else []

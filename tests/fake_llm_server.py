"""A tiny OpenAI-compatible chat-completions server that streams canned text over server-sent events.

Used by the LLM provider tests (importable: `FakeLLMServer`) and by benchmarks as a process whose first
token is instant:

    python tests/fake_llm_server.py --port 8011 --text "Hello there. How can I help?"

Plain asyncio HTTP/1.1 with keep-alive and chunked transfer, so the real httpx client is exercised: its
connection reuse, its timeouts, its handling of a dropped connection. The behaviour is the server's
`mode`, or per request the model name "fake-<mode>":

- ok: stream `text` word by word (first delta at once, then `token_delay` between deltas), then [DONE]
- http500 / http401: refuse with that status and an OpenAI-style JSON error body
- stall: send the headers, then nothing (until the client goes away)
- garbage: 200 text/event-stream whose lines are not server-sent events
- badjson: `data:` lines that are not JSON
- truncate: two deltas, then close the connection without [DONE]
- slow: like ok with 0.2 s between deltas (for cancellation tests)
- echo: like ok, the text being "You asked: " and the last user message's last line (whose reply is whose)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from typing import Any

DEFAULT_TEXT = (
    "Hello! I am a test assistant. This reply is streamed in small pieces, one word at a time, "
    "so the client sees it arrive."
)
MODES = ("ok", "http500", "http401", "stall", "garbage", "badjson", "truncate", "slow", "echo")


@dataclass
class ServerStats:
    """What the server saw, for assertions."""

    connections: int = 0  # TCP connections accepted
    requests: int = 0
    completed: int = 0  # streams that reached [DONE]
    aborted: int = 0  # streams the client left before the end
    bodies: list[dict[str, Any]] = field(default_factory=list)


class FakeLLMServer:
    """An asyncio server speaking the streamed chat-completions protocol; `async with` starts and stops it."""

    def __init__(
        self,
        text: str = DEFAULT_TEXT,
        host: str = "127.0.0.1",
        port: int = 0,
        mode: str = "ok",
        token_delay: float = 0.0,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}")
        self.text = text
        self.host = host
        self.port = port
        self.mode = mode
        self.token_delay = token_delay
        self.stats = ServerStats()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        """Base URL (without /v1)."""
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        """Listen; with port 0 a free port is picked (see `url`)."""
        self._server = await asyncio.start_server(self._handle, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop listening and drop open connections."""
        if self._server is not None:
            self._server.close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> FakeLLMServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.stats.connections += 1
        try:
            while await self._one_request(reader, writer):
                pass
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # stop() cancels open connections; asyncio would log this as an error in the server task
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        """Serve one request; False when the connection should close."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = (lines[0].split(" ") + ["", ""])[:3]
        headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:] if h)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        self.stats.requests += 1
        if method != "POST" or not path.endswith("/chat/completions"):
            await _respond(writer, 404, {"error": {"message": f"no route {method} {path}"}})
            return True
        try:
            request = json.loads(body)
        except ValueError:
            await _respond(writer, 400, {"error": {"message": "body is not JSON"}})
            return True
        self.stats.bodies.append(request)
        model = str(request.get("model", ""))
        mode = model.removeprefix("fake-") if model.startswith("fake-") and model[5:] in MODES else self.mode
        return await self._serve_mode(mode, request, reader, writer)

    async def _serve_mode(
        self, mode: str, request: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        if mode == "http500":
            await _respond(writer, 500, {"error": {"message": "the model crashed (fake)"}})
            return True
        if mode == "http401":
            await _respond(writer, 401, {"error": {"message": "invalid API key (fake)"}})
            return True
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        await writer.drain()
        if mode == "stall":
            await reader.read(1)  # returns at EOF, when the client gives up
            self.stats.aborted += 1
            return False
        if mode == "garbage":
            await _chunk(writer, b"<html>this is not an event stream</html>\n\n")
            await _chunk(writer, b"")
            return True
        if mode == "badjson":
            await _chunk(writer, b"data: {not json at all\n\n")
            await _chunk(writer, b"")
            return True
        words = (_echo(request) if mode == "echo" else self.text).split(" ")
        deltas = [w if i == 0 else " " + w for i, w in enumerate(words)]
        max_tokens = int(request.get("max_tokens") or len(deltas))
        deltas = deltas[:max_tokens]
        delay = 0.2 if mode == "slow" else self.token_delay
        created = int(time.time())
        for i, delta in enumerate(deltas):
            if mode == "truncate" and i == 2:
                return False  # closes the connection mid-stream
            if i and delay and await _client_left(reader, delay):
                self.stats.aborted += 1
                return False
            chunk = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "created": created,
                "model": request.get("model", ""),
                "choices": [{"index": 0, "delta": {"content": delta}, "finish_reason": None}],
            }
            await _chunk(writer, b"data: " + json.dumps(chunk).encode() + b"\n\n")
        final = {"id": "chatcmpl-fake", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        await _chunk(writer, b"data: " + json.dumps(final).encode() + b"\n\n")
        await _chunk(writer, b"data: [DONE]\n\n")
        await _chunk(writer, b"")
        self.stats.completed += 1
        return True


def _echo(request: dict[str, Any]) -> str:
    """The reply of the echo mode: the question (the user message's last line: notes come before it)."""
    users = [m for m in request.get("messages", []) if m.get("role") == "user"]
    question = str(users[-1].get("content", "")).strip().splitlines()[-1] if users else ""
    return f"You asked: {question}"


async def _client_left(reader: asyncio.StreamReader, delay: float) -> bool:
    """Wait `delay` seconds; True if the client closed the connection meanwhile."""
    try:
        data = await asyncio.wait_for(reader.read(1), delay)
    except asyncio.TimeoutError:
        return False
    return data == b""


async def _chunk(writer: asyncio.StreamWriter, data: bytes) -> None:
    """One HTTP/1.1 chunk (an empty one ends the body)."""
    writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    await writer.drain()


async def _respond(writer: asyncio.StreamWriter, status: int, payload: dict[str, Any]) -> None:
    body = json.dumps(payload).encode()
    reason = {400: "Bad Request", 401: "Unauthorized", 404: "Not Found", 500: "Internal Server Error"}[status]
    head = f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    head += "\r\n"
    writer.write(head.encode() + body)
    await writer.drain()


async def _serve_forever(args: argparse.Namespace) -> None:
    server = FakeLLMServer(args.text, host=args.host, port=args.port, mode=args.mode,
                           token_delay=args.token_delay_ms / 1000)
    await server.start()
    print(f"fake LLM server listening on {server.url}", flush=True)
    await asyncio.Event().wait()


def main() -> None:
    """Run the server until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8011)
    parser.add_argument("--text", default=DEFAULT_TEXT, help="the reply streamed to every request")
    parser.add_argument("--mode", default="ok", choices=MODES)
    parser.add_argument("--token-delay-ms", type=float, default=0.0, help="pause between deltas")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve_forever(args))


if __name__ == "__main__":
    main()

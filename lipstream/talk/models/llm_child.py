"""The embedded language model's own process: llama.cpp behind a local OpenAI-compatible streaming endpoint.

`python -m lipstream.talk.models.llm_child --model PATH --parent-pid PID` loads and warms the model, binds
127.0.0.1 on a free port, prints one JSON line `{"ready": true, "port": N, ...}` on stdout and serves
`POST /v1/chat/completions` (server-sent events, as `OpenAIChatModel` reads them) and `GET /health`, both only
for `Authorization: Bearer $LIPSTREAM_MODEL_KEY`. It dies with its parent (PR_SET_PDEATHSIG on Linux, and a
watchdog on the parent's pid everywhere). `lipstream.talk.models.model_process` starts and supervises it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field, ValidationError

from lipstream.talk.models.child_serving import authorized, run_child
from lipstream.talk.models.llm import ChatMessage


class _Message(BaseModel):
    role: Literal["system", "user", "assistant"]
    content: str = Field(max_length=100_000)


class ChatRequest(BaseModel):
    """The part of an OpenAI chat-completions request this endpoint reads."""

    messages: list[_Message] = Field(min_length=1, max_length=500)
    max_tokens: int = Field(120, ge=1, le=4096)
    stream: bool = True
    temperature: float | None = Field(None, ge=0, le=2)


def _chunk(completion_id: str, model: str, delta: dict[str, str], finish: str | None) -> str:
    body = {
        "id": completion_id, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }  # fmt: skip
    return f"data: {json.dumps(body)}\n\n"


def create_child_app(chat: Any, key: str, model_name: str) -> FastAPI:
    """The child's FastAPI app around a loaded `LlamaChat`."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    # the judge's context has a thread of its own, so a judgement never waits for an answer or notes being
    # read; answers and read-aheads go to the model's batched writer, which decodes them all on its thread
    judge_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="llm-judge")

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message}}, status_code=status)

    async def deltas(request: ChatRequest) -> AsyncIterator[str]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        cancel = threading.Event()
        messages = [ChatMessage(m.role, m.content) for m in request.messages]
        sampling = chat.sampling if request.temperature is None else replace(
            chat.sampling, temperature=request.temperature
        )

        def post(kind: str, value: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop may be gone after a cancellation
                loop.call_soon_threadsafe(queue.put_nowait, (kind, value))

        try:
            chat.answer(messages, request.max_tokens, cancel, lambda text: post("delta", text),
                        lambda error: post("end", error), sampling)  # fmt: skip
        except ValueError as exc:  # the prompt does not fit the context: reported as any other end
            post("end", exc)
        try:
            while True:
                kind, value = await queue.get()
                if kind == "delta":
                    yield value
                elif value is not None:  # the end, with the error that ended it
                    raise RuntimeError(f"{type(value).__name__}: {value}")
                else:
                    return
        finally:
            cancel.set()  # a client that went away stops generation within a token

    async def chat_request(request: Request) -> ChatRequest | JSONResponse:
        """The request's body, or the error response to send (wrong key, malformed body)."""
        if not authorized(request, key):
            return error(401, "wrong or missing key")
        try:
            return ChatRequest.model_validate(await request.json())
        except (ValidationError, ValueError) as exc:
            return error(400, f"bad request: {str(exc).splitlines()[0]}")

    @app.post("/v1/lipstream/end_of_turn")
    async def end_of_turn(request: Request) -> Any:
        # lipstream's own route (not OpenAI's): how likely the last user message is a finished turn
        body = await chat_request(request)
        if isinstance(body, JSONResponse):
            return body
        if body.messages[-1].role != "user":
            return error(400, "bad request: the last message must be the user's")
        messages = [ChatMessage(m.role, m.content) for m in body.messages]
        loop = asyncio.get_running_loop()
        probability = await loop.run_in_executor(judge_executor, chat.end_of_turn, messages)
        return {"probability": probability}

    @app.post("/v1/lipstream/read_ahead")
    async def read_ahead(request: Request) -> Any:
        # lipstream's own route: read the answer's prompt up to the open last message into the answer's cache
        body = await chat_request(request)
        if isinstance(body, JSONResponse):
            return body
        messages = [ChatMessage(m.role, m.content) for m in body.messages]
        loop = asyncio.get_running_loop()
        read: asyncio.Future[int] = loop.create_future()

        def done(tokens: int) -> None:
            with contextlib.suppress(RuntimeError):  # the loop may be gone
                loop.call_soon_threadsafe(lambda: read.done() or read.set_result(tokens))

        chat.read_ahead(messages, done)
        return {"tokens": await read}

    @app.get("/health")
    async def health(request: Request) -> Any:
        if not authorized(request, key):
            return error(401, "wrong or missing key")
        return {"status": "ok", "model": model_name, "pid": os.getpid()}

    @app.post("/v1/chat/completions")
    async def completions(request: Request) -> Any:
        body = await chat_request(request)
        if isinstance(body, JSONResponse):
            return body
        completion_id = f"chatcmpl-{uuid.uuid4().hex[:16]}"
        if not body.stream:
            text = "".join([d async for d in deltas(body)])
            message = {"role": "assistant", "content": text}
            return {"id": completion_id, "object": "chat.completion", "model": model_name,
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}  # fmt: skip

        async def events() -> AsyncIterator[str]:
            try:
                async for delta in deltas(body):
                    yield _chunk(completion_id, model_name, {"content": delta}, None)
            except RuntimeError as exc:
                yield f"data: {json.dumps({'error': {'message': str(exc)}})}\n\n"
                return
            yield _chunk(completion_id, model_name, {}, "stop")
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return app


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lipstream.talk.models.llm_child")
    parser.add_argument("--model", type=Path, required=True, help="the GGUF file")
    parser.add_argument("--parent-pid", type=int, required=True, help="exit when this process ends")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--context-tokens", type=int, default=2048)
    parser.add_argument("--name", default="embedded", help="model name in responses")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Load, warm, bind, announce readiness on stdout, serve until killed."""
    args = _parser().parse_args(argv)

    def load(key: str) -> tuple[FastAPI, dict[str, Any]]:
        from lipstream.talk.models.llm_llama import LlamaChat

        chat = LlamaChat(args.model, threads=args.threads, context_tokens=args.context_tokens)
        warm_seconds = chat.warm_up()
        ready = {"load_seconds": round(chat.load_seconds, 3), "warm_seconds": round(warm_seconds, 3)}
        return create_child_app(chat, key, args.name), ready

    return run_child(args.parent_pid, load)


if __name__ == "__main__":
    sys.exit(main())

"""GET/POST /api/tts: the server's voice as plain HTTP (text -> WAV), the serverless page's text fallback."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from lipstream.audio.encode import wav_bytes
from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.errors import LipstreamError
from lipstream.talk.text import check_text

MAX_BODY_BYTES = 64 * 1024  # a JSON body with max_text_chars of text fits many times over


def _error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": code, "message": message}, status_code=status)


def add_tts_routes(
    app: FastAPI,
    voices: Callable[[str], Any],
    voice: str,
    max_text_chars: int,
    authorized: Callable[[Request], bool],
) -> None:
    """GET /api/tts (what it accepts) and POST /api/tts {"text": ...} -> audio/wav (16 kHz mono s16).

    One synthesis at a time per server (the voice runs on one core, as in sessions); text is held to the
    same rules as a session's `speak`: a string with something to say, at most max_text_chars."""
    one_at_a_time = asyncio.Semaphore(1)

    def unauthorized() -> JSONResponse:
        return _error(401, "unauthorized", "missing or wrong token; send Authorization: Bearer TOKEN")

    @app.get("/api/tts")
    async def tts_info(request: Request) -> Any:
        """What POST /api/tts accepts."""
        if not authorized(request):
            return unauthorized()
        return {"endpoint": "tts", "voice": voice, "max_text_chars": max_text_chars,
                "sample_rate": SAMPLE_RATE, "format": "audio/wav"}  # fmt: skip

    @app.post("/api/tts")
    async def tts(request: Request) -> Any:
        """Speak {"text": "..."} with the server's voice; the whole utterance as one WAV."""
        if not authorized(request):
            return unauthorized()
        if (request.headers.get("content-type") or "").split(";")[0].strip() != "application/json":
            return _error(415, "bad_request", 'send Content-Type: application/json, body {"text": "..."}')
        body = await request.body()
        if len(body) > MAX_BODY_BYTES:
            return _error(413, "too_large", f"the body is over {MAX_BODY_BYTES} bytes; send less text")
        try:
            payload = await request.json()
        except ValueError:
            return _error(400, "bad_request", 'the body is not JSON; send {"text": "..."}')
        if not isinstance(payload, dict) or set(payload) != {"text"} or not isinstance(payload["text"], str):
            return _error(400, "bad_request", 'the body must be exactly {"text": "<string>"}')
        text = payload["text"]
        if len(text.strip()) > max_text_chars:
            return _error(
                413, "text_too_long",
                f"text of {len(text.strip())} characters is over the limit of {max_text_chars}; split it",
            )  # fmt: skip
        try:
            checked = check_text(text)
        except LipstreamError as exc:
            return _error(400, "bad_text", str(exc))
        try:
            async with one_at_a_time:
                speech = await asyncio.to_thread(lambda: voices(voice).synthesize(checked))
        except LipstreamError as exc:
            return _error(503, "tts_unavailable", str(exc))
        return Response(wav_bytes(speech.pcm), media_type="audio/wav", headers={"Cache-Control": "no-store"})

"""The embedded recogniser's own process: Whisper behind a local OpenAI-compatible transcription endpoint.

Inside the server's process a Whisper decode took 1.5-3x its time alone (the decode needs the GIL more than
its native threads suggest, and the event loop and render threads hold it: docs/conversation.md); in a
process of its own it keeps its pace, and a native crash there costs a turn, not the server.

`python -m lipstream.talk.hearing.stt_child --parent-pid PID [--model DIR]` loads and warms Whisper, binds
127.0.0.1
on a free port, prints one JSON line `{"ready": true, "port": N, ...}` and serves
`POST /v1/audio/transcriptions` (a multipart 16 kHz WAV, as `OpenAITranscriber` sends it; `verbose_json`
with word timings when `timestamp_granularities[]` asks for words) and `GET /health`, both only for
`Authorization: Bearer $LIPSTREAM_MODEL_KEY`. `workers` decodes run at once (a partial beside a final).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import wave
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from fastapi import FastAPI, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.talk.hearing.stt import BEAM_SIZE
from lipstream.talk.models.child_serving import authorized, run_child

MAX_WAV_BYTES = 16 * 1024 * 1024  # ~8 min of 16 kHz 16-bit audio: far over any turn (max_turn_seconds)


def read_wav(data: bytes) -> np.ndarray:
    """A 16 kHz mono 16-bit WAV as float32 PCM; ValueError naming what is wrong otherwise."""
    try:
        with wave.open(io.BytesIO(data)) as wav:
            shape = (wav.getframerate(), wav.getnchannels(), wav.getsampwidth())
            if shape != (SAMPLE_RATE, 1, 2):
                rate, channels, width = shape
                raise ValueError(f"want a 16 kHz mono 16-bit WAV, got {rate} Hz, {channels} ch, {width} B")
            frames = wav.readframes(wav.getnframes())
    except (wave.Error, EOFError) as exc:
        raise ValueError(f"not a WAV file: {exc}") from None
    return np.frombuffer(frames, "<i2").astype(np.float32) / 32768.0


def create_child_app(stt: Any, key: str, model_name: str) -> FastAPI:
    """The child's FastAPI app around a loaded `WhisperSTT` (its decodes are thread-safe)."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    def error(status: int, message: str) -> JSONResponse:
        return JSONResponse({"error": {"message": message}}, status_code=status)

    @app.get("/health")
    def health(request: Request) -> Any:
        if not authorized(request, key):
            return error(401, "wrong or missing key")
        return {"status": "ok", "model": model_name, "pid": os.getpid()}

    # a plain `def`: FastAPI runs it on its thread pool, so a partial decode and a final one run at once
    @app.post("/v1/audio/transcriptions")
    def transcriptions(
        request: Request,
        file: Annotated[UploadFile, File()],
        prompt: Annotated[str, Form()] = "",
        response_format: Annotated[str, Form()] = "json",
        granularities: Annotated[str, Form(alias="timestamp_granularities[]")] = "",
    ) -> Any:
        if not authorized(request, key):
            return error(401, "wrong or missing key")
        data = file.file.read(MAX_WAV_BYTES + 1)
        if len(data) > MAX_WAV_BYTES:
            return error(413, f"audio over {MAX_WAV_BYTES} bytes")
        try:
            pcm = read_wav(data)
        except ValueError as exc:
            return error(400, f"bad audio: {exc}")
        wants_words = response_format == "verbose_json" and granularities == "word"
        result = stt.transcribe_words(pcm, prompt) if wants_words or prompt else stt.transcribe(pcm)
        body: dict[str, Any] = {"text": result.text}
        if response_format == "verbose_json":
            body["duration"] = len(pcm) / SAMPLE_RATE
            if wants_words:
                body["words"] = [{"word": w, "start": a, "end": b} for w, a, b in result.words]
        return body

    return app


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lipstream.talk.hearing.stt_child")
    parser.add_argument("--parent-pid", type=int, required=True, help="exit when this process ends")
    parser.add_argument("--model", type=Path, default=None, help="a CTranslate2 Whisper folder")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads a decode uses")
    parser.add_argument("--workers", type=int, default=2, help="decodes that run at once")
    parser.add_argument("--window", choices=("audio", "full"), default="audio")
    parser.add_argument("--context", default="", help="text heard before any question (Whisper's prompt)")
    parser.add_argument("--beam", type=int, default=BEAM_SIZE, help="beam search width (1: greedy)")
    parser.add_argument("--name", default="embedded-whisper", help="model name in responses")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Load, warm, bind, announce readiness on stdout, serve until killed."""
    args = _parser().parse_args(argv)

    def load(key: str) -> tuple[FastAPI, dict[str, Any]]:
        from lipstream.talk.hearing.stt import WhisperSTT

        stt = WhisperSTT(args.model, cpu_threads=args.threads, workers=args.workers,
                         full_window=args.window == "full", context=args.context,
                         beam_size=args.beam)  # fmt: skip (it warms up)
        ready = {"load_seconds": round(stt.load_seconds, 3), "warm_seconds": round(stt.warm_up_seconds, 3)}
        return create_child_app(stt, key, args.name), ready

    return run_child(args.parent_pid, load)


if __name__ == "__main__":
    sys.exit(main())

"""A recogniser behind an OpenAI-compatible transcription endpoint (`POST /v1/audio/transcriptions`).

For a user's own, larger recogniser: faster-whisper-server / speaches, whisper.cpp's server, vLLM, or a hosted
API. The audio goes as a 16 kHz mono WAV in a multipart form: `response_format=json` for a whole turn's text,
`verbose_json` with word timestamps for streaming recognition; a server that returns words lets the
conversation decode only each turn's tail (lipstream.talk.hearing.transcriber), one that returns only text
still works
(its transcript is used whole).
"""

from __future__ import annotations

import io
import time
import wave

import httpx
import numpy as np

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.errors import ModelError
from lipstream.talk.hearing.stt import Transcript, WordTiming

_MAX_ERROR_BODY = 300


def transcriptions_url(url: str) -> str:
    """The transcription URL for a base URL that may already end in /v1 or /v1/audio/transcriptions."""
    base = url.strip().rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise ModelError(f"the recogniser url must start with http:// or https://, got {url!r}")
    if base.endswith("/audio/transcriptions"):
        return base
    if base.endswith("/v1"):
        return base + "/audio/transcriptions"
    return base + "/v1/audio/transcriptions"


def wav_bytes(pcm: np.ndarray) -> bytes:
    """16 kHz float PCM as a 16-bit mono WAV file."""
    samples = np.clip(np.asarray(pcm, np.float32).reshape(-1) * 32767.0, -32768, 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(SAMPLE_RATE)
        wav.writeframes(samples.tobytes())
    return out.getvalue()


class OpenAITranscriber:
    """Transcribes through an OpenAI-compatible endpoint; blocking, thread-safe (one httpx.Client)."""

    def __init__(
        self, url: str, model: str = "whisper-1", api_key: str | None = None, timeout: float = 10.0,
        language: str = "en",
    ) -> None:  # fmt: skip
        self.url = transcriptions_url(url)
        self.model = model
        self.language = language
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(timeout=httpx.Timeout(timeout), headers=headers)

    def transcribe(self, pcm: np.ndarray) -> Transcript:
        """Transcribe 16 kHz float32 mono PCM (blocking): the text only (word timings cost the server an
        alignment pass)."""
        return self._post(pcm, "", words=False)

    def transcribe_words(self, pcm: np.ndarray, prompt: str = "") -> Transcript:
        """Transcribe with word timings when the server gives them, primed with `prompt`."""
        return self._post(pcm, prompt, words=True)

    def _post(self, pcm: np.ndarray, prompt: str, words: bool) -> Transcript:
        seconds = len(pcm) / SAMPLE_RATE
        if len(pcm) < SAMPLE_RATE // 10:
            return Transcript("", seconds)
        started = time.perf_counter()
        form = {"model": self.model, "language": self.language, "temperature": "0", "response_format": "json"}
        if words:
            form.update({"response_format": "verbose_json", "timestamp_granularities[]": "word"})
        if prompt:
            form["prompt"] = prompt
        try:
            files = {"file": ("turn.wav", wav_bytes(pcm), "audio/wav")}
            response = self._client.post(self.url, data=form, files=files)
        except httpx.HTTPError as exc:
            raise ModelError(f"the recogniser at {self.url} did not answer: {exc}") from exc
        if response.status_code != 200:
            body = response.text[:_MAX_ERROR_BODY]
            raise ModelError(f"the recogniser at {self.url} answered {response.status_code}: {body}")
        try:
            data = response.json()
            text = str(data.get("text", "")).strip()
        except (ValueError, AttributeError) as exc:
            raise ModelError(f"the recogniser at {self.url} sent no JSON transcript: {exc}") from exc
        timings = _words(data.get("words")) if words else ()
        return Transcript(text, seconds, time.perf_counter() - started, words=timings)

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()


def _words(items: object) -> tuple[WordTiming, ...]:
    """verbose_json's `words` ([{word, start, end}]) as word timings; () when absent or malformed."""
    if not isinstance(items, list):
        return ()
    words: list[WordTiming] = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("word"), str):
            return ()
        try:
            start, end = float(item["start"]), float(item["end"])
        except (KeyError, TypeError, ValueError):
            return ()
        word = item["word"]
        words.append((word if word.startswith(" ") else " " + word, start, end))
    return tuple(words)

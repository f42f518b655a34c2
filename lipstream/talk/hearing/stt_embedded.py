"""The embedded recogniser, Whisper, in a supervised child process (lipstream.talk.hearing.stt_child).

This is the caller's side: it starts the child and transcribes through its local OpenAI-compatible endpoint
with `OpenAITranscriber`, so every recogniser goes through one client path. Blocking and thread-safe, as
`WhisperSTT` is; a decode while the child restarts waits for it, and a child that died mid-decode is asked
again once its successor is up. Measured in-process against its own process: docs/conversation.md.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

from lipstream.errors import ModelError
from lipstream.talk.hearing.stt import BEAM_SIZE, Transcript
from lipstream.talk.hearing.stt_openai import OpenAITranscriber
from lipstream.talk.models.model_process import (
    ChildCommand,
    Endpoint,
    RestartPolicy,
    SupervisedProcess,
)


class EmbeddedWhisper:
    """Whisper (bundled tiny.en, or a CTranslate2 folder) in its own process; `transcribe` and
    `transcribe_words` as `WhisperSTT`'s. `warm_up()` waits until it is loaded (ModelError when it cannot
    start); `close()` stops it."""

    name = "embedded:whisper"

    def __init__(
        self, model_path: str | Path | None = None, threads: int = 1, workers: int = 2, window: str = "audio",
        timeout: float = 10.0, turn_wait_seconds: float = 15.0, restart: RestartPolicy | None = None,
        python: str = sys.executable, context: str = "", beam: int = BEAM_SIZE,
    ) -> None:  # fmt: skip
        """`threads` per decode (on 2 cores one decodes as fast as two), `workers` decodes at once (a
        partial beside a final), `window`: "audio" or "full" (`WhisperSTT.full_window`), `context`: text
        heard before any question (`WhisperSTT.context`), `beam`: `WhisperSTT.beam_size`."""
        self.model_path = Path(model_path) if model_path is not None else None
        self.timeout = timeout
        self.turn_wait_seconds = turn_wait_seconds
        argv = [python, "-m", "lipstream.talk.hearing.stt_child", "--threads", str(threads),
                "--workers", str(workers), "--window", window, "--beam", str(beam)]  # fmt: skip
        if self.model_path is not None:
            argv += ["--model", str(self.model_path)]
        if context:
            argv += ["--context", context]
        label = f"recogniser {self.model_path.name if self.model_path else 'whisper tiny.en'}"
        self.process = SupervisedProcess(ChildCommand(argv, label), restart)
        self._client_of: tuple[int, OpenAITranscriber] | None = None  # (child generation, its client)
        self._lock = threading.Lock()
        self._started = time.perf_counter()
        self.process.start()

    def warm_up(self) -> float:
        """Wait until the child is loaded and warm; seconds since start. ModelError if it cannot start."""
        if self.process.wait_ready(self.process.policy.ready_timeout_seconds * 2) is None:
            why = self.process.failure()
            raise ModelError(f"the embedded recogniser could not start: {why}; run `lipstream doctor`")
        return time.perf_counter() - self._started

    def transcribe(self, pcm) -> Transcript:  # noqa: ANN001 - 16 kHz float32 mono PCM
        """Transcribe 16 kHz float32 mono PCM (blocking)."""
        return self._ask(lambda client: client.transcribe(pcm))

    def transcribe_words(self, pcm, prompt: str = "") -> Transcript:  # noqa: ANN001 - as `transcribe`
        """Transcribe with word timings, primed with `prompt` (blocking)."""
        return self._ask(lambda client: client.transcribe_words(pcm, prompt))

    def _ask(self, decode) -> Transcript:  # noqa: ANN001 - a call on an OpenAITranscriber
        """A decode on the current child; asked once more when that child died meanwhile."""
        for attempt in (1, 2):
            endpoint = self._endpoint()
            try:
                return decode(self._client(endpoint))
            except ModelError as exc:
                if attempt == 2 or not self.process.has_exited(endpoint, 0.5):
                    raise ModelError(f"the embedded recogniser failed: {exc}") from exc
        raise AssertionError("unreachable")

    def _endpoint(self) -> Endpoint:
        endpoint = self.process.wait_ready(self.turn_wait_seconds)  # a (re)starting child is waited for
        if endpoint is None:
            raise ModelError(f"the embedded recogniser is unavailable: {self.process.failure()}")
        return endpoint

    def _client(self, endpoint: Endpoint) -> OpenAITranscriber:
        """The client of the child behind `endpoint` (a new child: a new client, the old one closed)."""
        with self._lock:
            if self._client_of is not None and self._client_of[0] == endpoint.generation:
                return self._client_of[1]
            self._close_client()
            client = OpenAITranscriber(endpoint.url, "whisper", api_key=endpoint.key, timeout=self.timeout)
            self._client_of = (endpoint.generation, client)
            return client

    def _close_client(self) -> None:
        if self._client_of is not None:
            self._client_of[1].close()
            self._client_of = None

    def close(self) -> None:
        """Stop the child."""
        self.process.stop()
        with self._lock:
            self._close_client()

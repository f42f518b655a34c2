"""Fake parts for the conversation's turn state machine: a scripted microphone, recogniser, VAD, model,
voice and session. Each is small and deterministic, so the turn logic is tested in milliseconds.

The scripted microphone encodes words in the audio itself: each word is WORD_SECONDS of a constant level
(level k / 1000 is the k-th word of VOCABULARY, plus noise-free silence between them), so the fake
recogniser reads back exactly the words in the audio it is given, with their timings, and the fake VAD
hears speech wherever the level is not zero.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass, field

import numpy as np

from lipstream.audio.speech import Speech
from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.errors import ModelError
from lipstream.talk.hearing.stt import Transcript
from lipstream.talk.hearing.vad import VadEvent
from lipstream.talk.models.llm import ChatMessage, LLMError

VOCABULARY = (
    "what time does the library open today please tell me um how far is moon from earth and a short joke"
).split()
WORD_SECONDS = 0.25
CHUNK = 320  # 20 ms microphone chunks


def level(word: str) -> float:
    """The constant audio level that stands for `word`."""
    return (VOCABULARY.index(word) + 1) / 1000.0


def spoken(words: str, gap_seconds: float = 0.05) -> np.ndarray:
    """Audio that says `words` (space separated), a short gap after each word."""
    parts = []
    for word in words.split():
        parts.append(np.full(int(WORD_SECONDS * SAMPLE_RATE), level(word), np.float32))
        parts.append(np.zeros(int(gap_seconds * SAMPLE_RATE), np.float32))
    return np.concatenate(parts)


def silence(seconds: float) -> np.ndarray:
    """Silent microphone audio."""
    return np.zeros(int(seconds * SAMPLE_RATE), np.float32)


def cough(seconds: float = 0.3) -> np.ndarray:
    """Voiced audio the recogniser reads as no word (a level outside the vocabulary)."""
    return np.full(int(seconds * SAMPLE_RATE), 0.9, np.float32)


class ScriptedSTT:
    """Reads the words back from scripted audio, with word timings; records every decode's length."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, str]] = []  # (kind, audio seconds, prompt)

    def _words(self, pcm: np.ndarray) -> list[tuple[str, float, float]]:
        words: list[tuple[str, float, float]] = []
        codes = np.rint(np.asarray(pcm) * 1000).astype(int)
        i = 0
        while i < len(codes):
            code = codes[i]
            j = i
            while j < len(codes) and codes[j] == code:
                j += 1
            # a word is read only when most of it is in the audio (as Whisper would)
            if 1 <= code <= len(VOCABULARY) and (j - i) >= 0.6 * WORD_SECONDS * SAMPLE_RATE:
                words.append((" " + VOCABULARY[code - 1], i / SAMPLE_RATE, j / SAMPLE_RATE))
            i = j
        return words

    def transcribe(self, pcm: np.ndarray) -> Transcript:
        """Whole-audio decode."""
        self.calls.append(("plain", len(pcm) / SAMPLE_RATE, ""))
        words = self._words(pcm)
        return Transcript("".join(w for w, _, _ in words).strip(), len(pcm) / SAMPLE_RATE)

    def transcribe_words(self, pcm: np.ndarray, prompt: str = "") -> Transcript:
        """Decode with word timings."""
        self.calls.append(("words", len(pcm) / SAMPLE_RATE, prompt))
        words = self._words(pcm)
        text = "".join(w for w, _, _ in words).strip()
        return Transcript(text, len(pcm) / SAMPLE_RATE, words=tuple(words))


class FailingSTT(ScriptedSTT):
    """A recogniser whose endpoint is down: every decode raises ModelError."""

    def transcribe_words(self, pcm: np.ndarray, prompt: str = "") -> Transcript:
        """Always fails."""
        raise ModelError("the recogniser at http://127.0.0.1:9/v1/audio/transcriptions did not answer")


class PlainSTT:
    """A recogniser with no word timings (a user's endpoint): whole-turn decodes only."""

    def __init__(self) -> None:
        self.inner = ScriptedSTT()

    def transcribe(self, pcm: np.ndarray) -> Transcript:
        """Whole-audio decode."""
        return self.inner.transcribe(pcm)


class LevelVAD:
    """A VAD over the scripted audio: speech wherever the level is not zero, in 32 ms windows, with the
    real detector's events and explicit `end_turn`."""

    WINDOW = 512

    def __init__(self, start_ms: float = 100, pause_ms: float = 96, end_silence_ms: float = 500) -> None:
        ms = 1000 * self.WINDOW / SAMPLE_RATE
        self.start_windows = max(1, round(start_ms / ms))
        self.pause_windows = max(1, round(pause_ms / ms))
        self.end_windows = max(1, round(end_silence_ms / ms))
        self._pending = np.zeros(0, np.float32)
        self._position = 0
        self.in_speech = False
        self._voiced = 0
        self._silent = 0
        self._silence_start = 0
        self._paused = False
        self._start = 0

    @property
    def silence_ms(self) -> float:
        """Silence so far in the open turn."""
        return self._silent * 1000 * self.WINDOW / SAMPLE_RATE if self.in_speech else 0.0

    def push(self, pcm: np.ndarray) -> list[VadEvent]:
        """Feed audio; the events it caused."""
        buf = np.concatenate([self._pending, np.asarray(pcm, np.float32)])
        events: list[VadEvent] = []
        n = len(buf) // self.WINDOW
        for k in range(n):
            window = buf[k * self.WINDOW : (k + 1) * self.WINDOW]
            self._window(bool(np.any(window != 0)), events)
        self._pending = buf[n * self.WINDOW :]
        return events

    def _window(self, voiced: bool, events: list[VadEvent]) -> None:
        start = self._position
        self._position += self.WINDOW
        if not self.in_speech:
            if voiced:
                if self._voiced == 0:
                    self._start = start
                self._voiced += 1
                if self._voiced >= self.start_windows:
                    self.in_speech, self._silent, self._paused = True, 0, False
                    events.append(VadEvent("speech_start", self._start))
            else:
                self._voiced = 0
            return
        if voiced:
            if self._paused:
                events.append(VadEvent("resume", start))
            self._silent, self._paused = 0, False
            return
        if self._silent == 0:
            self._silence_start = start
        self._silent += 1
        if not self._paused and self._silent >= self.pause_windows:
            self._paused = True
            events.append(VadEvent("pause", self._silence_start))
        if self._silent >= self.end_windows:
            events.append(self._finish())

    def _finish(self) -> VadEvent:
        self.in_speech, self._paused, self._voiced, self._silent = False, False, 0, 0
        return VadEvent("speech_end", self._silence_start)

    def end_turn(self) -> VadEvent | None:
        """End the open turn in its silence."""
        if not self.in_speech or self._silent == 0:
            return None
        return self._finish()


class ScriptedLLM:
    """Streams a fixed answer a word at a time; records the messages of every call."""

    def __init__(
        self, answer: str = "The library opens at nine. It closes at six.", delay: float = 0.001,
        fail: bool = False,
    ) -> None:
        self.answer = answer
        self.delay = delay
        self.fail = fail  # raise LLMError before the first token
        self.calls: list[list[ChatMessage]] = []
        self.prefilled: list[list[ChatMessage]] = []
        self.name = "scripted"

    async def prefill(self, messages: list[ChatMessage]) -> None:
        """Records what it was asked to read ahead."""
        self.prefilled.append(list(messages))

    async def stream(self, messages: list[ChatMessage], max_tokens: int = 120) -> AsyncIterator[str]:
        """The answer's words as deltas."""
        self.calls.append(list(messages))
        if self.fail:
            raise LLMError("the model is unavailable")
        for i, word in enumerate(self.answer.split()):
            await asyncio.sleep(self.delay)
            yield word if i == 0 else " " + word


class YieldingLLM(ScriptedLLM):
    """A ScriptedLLM that can be paused (as the embedded model's process is): records the calls in `log`."""

    def __init__(self, log: list[str], **kwargs) -> None:  # noqa: ANN003
        super().__init__(**kwargs)
        self.log = log
        self.paused = False

    def pause(self, seconds: float) -> None:
        """Records the pause."""
        self.paused = True
        self.log.append("pause")

    def resume(self) -> None:
        """Records the resume (only when paused, as the real one acts only then)."""
        if self.paused:
            self.paused = False
            self.log.append("resume")


class ToneVoice:
    """A voice that speaks each sentence as 10 ms of tone a character (no model)."""

    name = "tone"

    def synthesize(self, text: str) -> Speech:
        """One utterance."""
        t = np.arange(int(len(text) * 0.01 * SAMPLE_RATE)) / SAMPLE_RATE
        return Speech((0.1 * np.sin(2 * np.pi * 200 * t)).astype(np.float32), text=text)

    def synthesize_sentences(self, text: str):  # noqa: ANN201 - an iterator of Speech
        """The text as one sentence."""
        yield self.synthesize(text)


@dataclass
class RecordingSession:
    """The avatar session: records what it is asked to say, plays it instantly, can be interrupted."""

    said: list[list[str]] = field(default_factory=list)  # each utterance's sentences
    interrupts: int = 0
    speaking: bool = False
    hold: asyncio.Event | None = None  # set: utterances stay "playing" until released
    _uid: int = 0

    async def push_speech_stream(
        self, speeches: AsyncIterable[Speech], on_utterance: Callable[[int], None] | None = None
    ) -> int:
        """Consume the sentences of one utterance."""
        self._uid += 1
        if on_utterance is not None:
            on_utterance(self._uid)
        sentences: list[str] = []
        self.said.append(sentences)
        self.speaking = True
        async for speech in speeches:
            sentences.append(speech.text or "")
        if self.hold is None:
            self.speaking = False
        return self._uid

    def interrupt(self) -> int:
        """Stop at once."""
        self.interrupts += 1
        self.speaking = False
        return 0

    def is_speaking(self) -> bool:
        """Speech pending or playing."""
        return self.speaking

    def playback_position(self) -> int:
        """Nothing is played through a clock here."""
        return 0

    def heard_text(self, utterance_id: int, until_pts: int) -> str:
        """The first sentence counts as heard."""
        said = self.said[utterance_id - 1] if 0 < utterance_id <= len(self.said) else []
        return said[0] if said else ""


class FixedJudge:
    """A turn detector with a fixed opinion (a text detector: it needs the transcript)."""

    name = "text"
    needs_text = True

    def __init__(self, score: float) -> None:
        self.value = score
        self.seen: list[str] = []
        self.messages: list[list[ChatMessage]] = []
        self.read: list[list[ChatMessage]] = []

    async def score(self, audio: np.ndarray, messages: list[ChatMessage]) -> float:
        """The fixed score; remembers the transcript it judged."""
        self.seen.append(messages[-1].content)
        self.messages.append(list(messages))
        return self.value

    async def prefill(self, messages: list[ChatMessage]) -> None:
        """Remembers what it read ahead (a text detector reads the question while the user speaks)."""
        self.read.append(list(messages))

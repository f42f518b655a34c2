"""The conversation benchmark's questions: scripted, held-out and paused speech as WAVs, and the WER."""

from __future__ import annotations

import subprocess
import sys
import wave
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from paused_speech import PAUSED_QUESTIONS, paused_question  # noqa: E402

from lipstream.talk.hearing.stt import word_edits  # noqa: E402

QUESTIONS = (
    "What is the weather like in the city today?",
    "Can you recommend a good book for a long train journey?",
    "How do I make a cup of green tea?",
    "What time does the library close on Saturday?",
    "Tell me something interesting about the moon.",
    "Which is the fastest way to get to the airport?",
    "Could you explain how a rainbow forms?",
    "What should I cook for dinner tonight?",
    "How far is the nearest train station from here?",
    "Why is the sky blue during the day?",
    "Do you know a quick exercise to relax my shoulders?",
    "What is the capital city of Australia?",
)
# turn_metrics' stages, since the end of speech (an older server reports the first four only)
STAGES = ("transcript", "decision", "llm_first_token", "first_phrase", "first_audio", "first_frame")
# held out: questions and voices no test uses (espeak-ng voice variants, other accents and speeds)
HELDOUT_QUESTIONS = (
    "What time does the library open on Saturday morning?",
    "How far away is the moon from the earth?",
    "Can you tell me a short joke about cats?",
    "Where can I park my car near the museum?",
    "How long should I boil an egg?",
    "What is a good name for a small black dog?",
    "Is it going to snow in the mountains this week?",
    "Which planet is the largest in our solar system?",
    "How do I say thank you in Spanish?",
    "What can I do on a rainy afternoon with children?",
    "Why do leaves change colour in autumn?",
    "How many hours of sleep does an adult need?",
)
HELDOUT_VOICES = (("en-gb+Andy", 165), ("en-us+Annie", 150), ("en-029+m3", 160), ("en-gb-scotland+f2", 155))
BARGE_IN_NOTE = (
    "user speech onset -> last avatar speech frame shown, measured in headless Chromium by the browser Talk "
    "test (tests/test_browser_talk.py), not by this script: null here"
)


# ----- word error rate ------------------------------------------------------------------------------------


def wer(pairs: list[tuple[str, str]]) -> float | None:
    """Corpus word error rate of (reference, hypothesis) pairs: all edits over all reference words."""
    counts = [word_edits(r, h) for r, h in pairs]
    words = sum(n for _, n in counts)
    return None if words == 0 else round(sum(e for e, _ in counts) / words, 4)


# ----- questions ------------------------------------------------------------------------------------------


def _write_wav(path: Path, pcm: np.ndarray) -> None:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(np.clip(pcm * 32767, -32768, 32767).astype("<i2").tobytes())


def make_paused_questions(folder: Path, count: int) -> list[dict[str, Any]]:
    """WAVs of questions with a 0.5-0.8 s pause after an unfinished clause (tests/paused_speech.py), Piper
    and espeak-ng alternately: answering before the second part is an early answer."""
    from lipstream.talk.voices.tts import create_tts

    voices = {"piper": create_tts("piper", fallback=False), "espeak": create_tts("espeak")}
    made = []
    for i in range(count):
        before, after = PAUSED_QUESTIONS[i % len(PAUSED_QUESTIONS)]
        voice = "piper" if i % 2 == 0 else "espeak"
        pause = (0.5, 0.6, 0.7, 0.8)[i % 4]
        question = paused_question(voices[voice], before, after, pause)
        pcm = np.concatenate([np.zeros(8000, np.float32), question.pcm, np.zeros(3200, np.float32)])
        path = folder / f"p{i:02d}_{voice}.wav"
        _write_wav(path, pcm)
        made.append({"text": question.text, "voice": voice, "path": path, "pause_s": pause,
                     "seconds": round(len(pcm) / 16000, 2)})  # fmt: skip
    return made


def espeak_wav(text: str, voice: str, speed: int) -> np.ndarray:
    """`espeak-ng -v VOICE -s SPEED` speech as 16 kHz float PCM (the CLI, not lipstream's voice)."""
    from scipy.signal import resample_poly

    raw = subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "--stdout", text],
                         capture_output=True, check=True).stdout  # fmt: skip
    with wave.open(__import__("io").BytesIO(raw)) as wav:
        rate = wav.getframerate()
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), "<i2").astype(np.float32) / 32768.0
    return resample_poly(pcm, 16000, rate).astype(np.float32)


def make_heldout_questions(folder: Path, count: int) -> list[dict[str, Any]]:
    """WAVs of held-out questions in held-out voices (espeak-ng variants no test uses), silence around."""
    made = []
    for i in range(count):
        text = HELDOUT_QUESTIONS[i % len(HELDOUT_QUESTIONS)]
        voice, speed = HELDOUT_VOICES[i % len(HELDOUT_VOICES)]
        speech = espeak_wav(text, voice, speed)
        pcm = np.concatenate([np.zeros(8000, np.float32), speech, np.zeros(3200, np.float32)])
        path = folder / f"h{i:02d}.wav"
        _write_wav(path, pcm)
        made.append({"text": text, "voice": voice, "path": path, "seconds": round(len(pcm) / 16000, 2)})
    return made


def make_questions(folder: Path, count: int) -> list[dict[str, Any]]:
    """WAVs of the scripted questions, Piper and espeak-ng alternately, with silence before and after."""
    from lipstream.talk.voices.tts import create_tts

    voices = {"piper": create_tts("piper", fallback=False), "espeak": create_tts("espeak")}
    made = []
    for i in range(count):
        text = QUESTIONS[i % len(QUESTIONS)]
        voice = "piper" if i % 2 == 0 else "espeak"
        speech = voices[voice].synthesize(text).pcm
        pcm = np.concatenate([np.zeros(8000, np.float32), speech, np.zeros(3200, np.float32)])
        path = folder / f"q{i:02d}_{voice}.wav"
        _write_wav(path, pcm)
        made.append({"text": text, "voice": voice, "path": path, "seconds": round(len(pcm) / 16000, 2)})
    return made

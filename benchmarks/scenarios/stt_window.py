"""Whisper on the audio's own window (at several floors) vs its fixed 30 s window, side by side in one run
(issue 35).

Speaks a set of questions in Piper's voice and an espeak-ng voice no test uses (en-us+m3), places each with
0, 0.2 and 0.5 s of silence before and 0, 0.1 and 0.3 s after (where a turn's cut may fall), adds the
conversation bench's held-out questions in its four held-out espeak-ng voices, and transcribes every clip
with each encoder window (lipstream.talk.hearing.whisper_window; one thread, as `serve --agent` decodes):
time per
transcript, the word error rate against the text spoken, and the clips whose words differ.

    .venv/bin/python -m benchmarks stt_window [--floors 10 5]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from rich.progress import track

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # run as a file: `benchmarks` is a package at the repository root
    sys.path.append(str(REPO))  # after PYTHONPATH: a before/after run names its own lipstream there

from benchmarks.results import Figure, cpu_model, record  # noqa: E402

QUESTIONS = (
    "What is the capital city of Australia?",
    "Could you please tell me which planet is the largest?",
    "How far is the station from here?",
    "What time does the library open?",
    "Can you recommend a good book for a long train journey?",
    "Hello.",
)
BEFORE_S, AFTER_S = (0.0, 0.2, 0.5), (0.0, 0.1, 0.3)


def spoken(texts: tuple[str, ...]) -> list[tuple[str, str, np.ndarray]]:
    """(voice, text, 16 kHz float32 PCM) for each text in Piper's voice and in espeak-ng's en-us+m3."""
    from lipstream.talk.voices.espeak_tts import EspeakTTS
    from lipstream.talk.voices.tts import create_tts

    voices = {"piper": create_tts("piper"), "espeak": EspeakTTS(voice="en-us+m3")}
    return [
        (name, text, np.asarray(tts.synthesize(text).pcm, np.float32))
        for text in texts
        for name, tts in voices.items()
    ]


def heldout() -> list[tuple[str, str, np.ndarray]]:
    """The conversation bench's held-out questions in its held-out voices, 0.2 s of silence before and 0.1
    after."""
    from benchmarks.scenarios.conversation_questions import HELDOUT_QUESTIONS, HELDOUT_VOICES, espeak_wav

    pad = [np.zeros(int(s * 16000), np.float32) for s in (0.2, 0.1)]
    return [
        (voice, text, np.concatenate([pad[0], espeak_wav(text, voice, speed), pad[1]]))
        for text in HELDOUT_QUESTIONS
        for voice, speed in HELDOUT_VOICES
    ]


def main(argv: list[str] | None = None) -> int:
    """Transcribe every clip with every window; print and record time and WER."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="Whisper's CPU threads (serve --agent's: 1)")
    parser.add_argument("--floors", type=float, nargs="+", default=[10.0, 5.0],
                        help="the audio window's floors to compare, seconds")  # fmt: skip
    args = parser.parse_args(argv)
    from lipstream.talk.hearing.stt import WhisperSTT, word_edits

    cases = []
    for voice, text, pcm in spoken(QUESTIONS):
        for before in BEFORE_S:
            for after in AFTER_S:
                pad = [np.zeros(int(s * 16000), np.float32) for s in (before, after)]
                cases.append((voice, text, np.concatenate([pad[0], pcm, pad[1]])))
    cases += heldout()
    models = {"full": WhisperSTT(cpu_threads=args.threads, workers=1, full_window=True)}
    for floor in args.floors:
        models[f"{floor:g} s floor"] = WhisperSTT(
            cpu_threads=args.threads, workers=1, window_floor_seconds=floor
        )
    seconds: dict[str, list[float]] = {name: [] for name in models}
    edits = {name: 0 for name in models}
    heard: dict[str, list[str]] = {name: [] for name in models}
    words = 0
    for _voice, text, pcm in track(cases, description="clips"):
        words += len(text.split())
        for name, model in models.items():  # alternately, so drifting load falls on all
            started = time.perf_counter()
            result = model.transcribe(pcm)
            seconds[name].append(time.perf_counter() - started)
            edits[name] += word_edits(text, result.text)[0]
            heard[name].append(result.text)
    for i, (voice, text, _) in enumerate(cases):
        if len({heard[name][i] for name in models}) > 1:
            print(f"  {voice:6s} {text!r}: " + " | ".join(f"{name}: {heard[name][i]!r}" for name in models))
    print(f"CPU {cpu_model()}; {len(cases)} clips, {words} words; {args.threads} thread(s)")
    figures = []
    for name in models:
        p50 = float(np.median(seconds[name])) * 1000
        wer = edits[name] / words
        print(f"{name:12s} window: transcript p50 {p50:.0f} ms, WER {wer:.3f}")
        figures += [
            Figure(f"Whisper transcript of a question p50 ({name} window)", round(p50), "ms"),
            Figure(f"Whisper WER, {len(cases)} placed questions ({name} window)", round(wer, 4), "ratio"),
        ]
    floors = " ".join(f"{floor:g}" for floor in args.floors)
    record("stt_window", figures, f"python -m benchmarks stt_window --floors {floors}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

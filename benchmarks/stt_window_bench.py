"""Whisper on the audio's own window vs its fixed 30 s window, side by side in one run (issue 35).

Speaks a set of questions in Piper's voice and an espeak-ng voice no test uses (en-us+m3), places each with
0, 0.2 and 0.5 s of silence before and 0, 0.1 and 0.3 s after (where a turn's cut may fall), and transcribes
every clip with both encoders (lipstream.talk.whisper_window): time per transcript, the word error rate
against the text spoken, and the clips whose words differ.

    .venv/bin/python -m benchmarks stt_window
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
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
    from lipstream.talk.espeak_tts import EspeakTTS
    from lipstream.talk.tts import create_tts

    voices = {"piper": create_tts("piper"), "espeak": EspeakTTS(voice="en-us+m3")}
    return [
        (name, text, np.asarray(tts.synthesize(text).pcm, np.float32))
        for text in texts
        for name, tts in voices.items()
    ]


def main(argv: list[str] | None = None) -> int:
    """Transcribe every placement with both windows; print and record time and WER."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2, help="Whisper's CPU threads (the final's: 2)")
    args = parser.parse_args(argv)
    from lipstream.talk.stt import WhisperSTT, word_edits

    cases = []
    for voice, text, pcm in spoken(QUESTIONS):
        for before in BEFORE_S:
            for after in AFTER_S:
                pad = [np.zeros(int(s * 16000), np.float32) for s in (before, after)]
                cases.append((voice, text, np.concatenate([pad[0], pcm, pad[1]])))
    models = {
        "full": WhisperSTT(cpu_threads=args.threads, workers=1, full_window=True),
        "audio": WhisperSTT(cpu_threads=args.threads, workers=1),
    }
    seconds = {name: [] for name in models}
    edits = {name: 0 for name in models}
    heard: dict[str, list[str]] = {name: [] for name in models}
    words = 0
    for _voice, text, pcm in cases:
        words += len(text.split())
        for name, model in models.items():  # alternately, so drifting load falls on both
            started = time.perf_counter()
            result = model.transcribe(pcm)
            seconds[name].append(time.perf_counter() - started)
            edits[name] += word_edits(text, result.text)[0]
            heard[name].append(result.text)
    for i, (voice, text, _) in enumerate(cases):
        if heard["full"][i] != heard["audio"][i]:
            print(f"  {voice:6s} {text!r}: full {heard['full'][i]!r} | audio {heard['audio'][i]!r}")
    print(f"CPU {cpu_model()}; {len(cases)} clips, {words} words")
    figures = []
    for name in models:
        p50 = float(np.median(seconds[name])) * 1000
        wer = edits[name] / words
        print(f"{name:5s} window: transcript p50 {p50:.0f} ms, WER {wer:.3f}")
        figures += [
            Figure(f"Whisper transcript of a question p50 ({name} window)", round(p50), "ms"),
            Figure(f"Whisper WER, {len(cases)} placed questions ({name} window)", round(wer, 4), "ratio"),
        ]
    record("stt_window", figures, "python -m benchmarks stt_window")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

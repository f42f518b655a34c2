"""Streaming recognition's final transcript: words committed from the first decodes (a prompted tail at the
end, as before) vs a question read whole (nothing committed under `commit_after_seconds`), side by side in
one run, beside a single whole decode.

Speaks the stt_window scenario's questions (Piper and an espeak-ng voice no test uses) with 0.25 s of silence
before and 0.4 s after, and the conversation bench's held-out questions in its held-out voices; runs a turn's
partial decodes every 0.5 s, starting at 4 phases (where a live turn's schedule may fall), then the final
decode, with Whisper tiny.en on one thread as `serve --agent --streaming-stt` does. Prints and records the
final decode's time and the word error rate of each way.

    .venv/bin/python -m benchmarks stt_streaming [--phases 4]
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
from benchmarks.scenarios.stt_window import QUESTIONS, heldout, spoken  # noqa: E402
from lipstream.talk.hearing.transcriber import WHOLE_TURN_SECONDS  # noqa: E402

SR = 16000
EVERY_S = 0.5  # ConversationConfig.partial_every_seconds
WAYS = {"committed from the start": 0.0, f"read whole under {WHOLE_TURN_SECONDS:g} s": WHOLE_TURN_SECONDS}


def final_of(stt, pcm: np.ndarray, commit_after: float, phase: float) -> tuple[str, float]:
    """A turn's partial decodes every EVERY_S from `phase` on, then its final: (text, final decode s)."""
    from lipstream.talk.hearing.transcriber import TurnRecogniser

    recog = TurnRecogniser(stt, stt, 0, whole_turn_seconds=commit_after)
    at = phase + EVERY_S
    while at * SR < len(pcm) - 0.4 * SR:  # the last partial before the turn's end silence
        start = recog.audio_from()
        recog.partial(pcm[start : int(at * SR)], start)
        at += EVERY_S
    start = recog.audio_from()
    began = time.perf_counter()
    text = recog.final(pcm[start:], start)
    return text, time.perf_counter() - began


def main(argv: list[str] | None = None) -> int:
    """Decode every clip each way; print and record the final decode's time and WER."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phases", type=int, default=4, help="partial schedules per clip, 0.5 s / N apart")
    args = parser.parse_args(argv)
    from lipstream.talk.hearing.stt import WhisperSTT, word_edits

    pad = [np.zeros(int(s * SR), np.float32) for s in (0.25, 0.4)]
    cases = [(voice, text, np.concatenate([pad[0], pcm, pad[1]])) for voice, text, pcm in spoken(QUESTIONS)]
    cases += heldout()
    stt = WhisperSTT(cpu_threads=1, workers=1)
    names = [*WAYS, "one whole decode"]
    seconds: dict[str, list[float]] = {name: [] for name in names}
    edits = dict.fromkeys(names, 0)
    words = dict.fromkeys(names, 0)
    for voice, text, pcm in track(cases, description="clips"):
        for phase in np.arange(args.phases) * EVERY_S / args.phases:
            for name, commit_after in WAYS.items():  # alternately, so drifting load falls on both
                heard, took = final_of(stt, pcm, commit_after, float(phase))
                seconds[name].append(took)
                edits[name] += word_edits(text, heard)[0]
                words[name] += len(text.split())
                if name == "committed from the start" and phase == 0:
                    print(f"  {voice:8s} {text!r}: {heard!r}")
        began = time.perf_counter()
        heard = stt.transcribe_words(pcm, "").text
        seconds["one whole decode"].append(time.perf_counter() - began)
        edits["one whole decode"] += word_edits(text, heard)[0]
        words["one whole decode"] += len(text.split())
    print(f"CPU {cpu_model()}; {len(cases)} clips x {args.phases} partial schedules; tiny.en, 1 thread")
    figures = []
    for name in names:
        p50 = float(np.median(seconds[name])) * 1000
        wer = edits[name] / words[name]
        print(f"{name:26s} final decode p50 {p50:4.0f} ms, WER {wer:.3f}")
        figures += [
            Figure(f"Streaming recognition: final decode p50 ({name})", round(p50), "ms"),
            Figure(f"Streaming recognition: WER of {len(cases)} questions ({name})", round(wer, 4), "ratio"),
        ]
    record("stt_streaming", figures, f"python -m benchmarks stt_streaming --phases {args.phases}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The end-of-turn detectors judged side by side on the same spoken questions (issue 23), offline.

For each question of tests/paused_speech.py (Piper and espeak-ng), two moments are judged: the pause after
the unfinished clause (the right answer: not finished) and the end of the whole question (finished). The
`text` detector judges the transcript Whisper makes of the audio up to that moment (through the embedded
SmolLM2 in its own process, as `serve --agent` runs it); `smart-turn` judges the audio itself. Prints and
writes, per detector and voice, how many unfinished pauses it would have answered (early answers) and how
many finished questions it would have kept waiting (to the hard cap), with its time per judgement.

    .venv/bin/python -m benchmarks turn_detector [--out benchmarks/results/turn_detector_bench.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
from bench_common import cpu_model

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from paused_speech import PAUSED_QUESTIONS, paused_question  # noqa: E402

from lipstream.talk.conversation_types import DEFAULT_SYSTEM_PROMPT  # noqa: E402
from lipstream.talk.models.llm import ChatMessage  # noqa: E402
from lipstream.talk.turn_rule import TurnEndConfig  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"
TRAILING = np.zeros(int(0.2 * 16000), np.float32)  # the silence a detector hears at its decision


def judge_all(pause_s: float) -> dict:
    """Every question, both moments, both detectors."""
    from lipstream.talk.hearing.smart_turn import SmartTurnModel
    from lipstream.talk.hearing.stt import WhisperSTT
    from lipstream.talk.models.llm_embedded import EmbeddedChatModel
    from lipstream.talk.voices.tts import create_tts

    stt = WhisperSTT(cpu_threads=2, workers=1)
    audio_model = SmartTurnModel()
    judge = EmbeddedChatModel()
    judge.warm_up()
    system = ChatMessage("system", DEFAULT_SYSTEM_PROMPT)
    rows = []
    try:
        for voice in ("piper", "espeak"):
            tts = create_tts(voice, fallback=False) if voice == "piper" else create_tts("espeak")
            for before, after in PAUSED_QUESTIONS:
                q = paused_question(tts, before, after, pause_s)
                moments = {"unfinished": q.pcm[: q.pause_at], "finished": q.pcm}
                for moment, pcm in moments.items():
                    heard = np.concatenate([np.zeros(8000, np.float32), pcm, TRAILING])
                    t0 = time.perf_counter()
                    audio_score = audio_model(heard)
                    t1 = time.perf_counter()
                    text = stt.transcribe(heard).text.strip()
                    t2 = time.perf_counter()
                    text_score = asyncio.run(judge.end_of_turn([system, ChatMessage("user", text)]))
                    t3 = time.perf_counter()
                    rows.append({
                        "voice": voice, "question": q.text, "moment": moment, "transcript": text,
                        "smart_turn": round(audio_score, 4), "text": round(text_score, 5),
                        "smart_turn_ms": round((t1 - t0) * 1000, 1),
                        "transcript_ms": round((t2 - t1) * 1000, 1), "text_ms": round((t3 - t2) * 1000, 1),
                    })  # fmt: skip
                    print(f"{voice:6s} {moment:10s} smart-turn {audio_score:.3f}  text {text_score:.4f}  "
                          f"{text!r}", flush=True)  # fmt: skip
    finally:
        asyncio.run(judge.aclose())
    return {"rows": rows, "summary": summarise(rows)}


def summarise(rows: list[dict]) -> dict:
    """Per detector and voice: early answers (unfinished judged finished) and waits (finished judged not)."""
    out: dict = {}
    for detector in ("text", "smart_turn"):
        config = TurnEndConfig(detector="text" if detector == "text" else "smart-turn")
        for voice in ("piper", "espeak", "all"):
            mine = [r for r in rows if voice in ("all", r["voice"])]
            unfinished = [r for r in mine if r["moment"] == "unfinished"]
            finished = [r for r in mine if r["moment"] == "finished"]
            out[f"{detector}/{voice}"] = {
                "early_answers": sum(config.finished(r[detector]) for r in unfinished),
                "unfinished_pauses": len(unfinished),
                "kept_waiting": sum(not config.finished(r[detector]) for r in finished),
                "finished_questions": len(finished),
                "judge_ms_p50": round(float(np.median([r[f"{detector}_ms"] for r in mine])), 1),
            }
    return out


def main(argv: list[str] | None = None) -> int:
    """Judge, print the summary, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pause", type=float, default=0.7, help="the pause cut into each question (s)")
    parser.add_argument("--out", type=Path, default=RESULTS / "turn_detector_bench.json")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    result = {
        "date": time.strftime("%Y-%m-%d"), "cpu": cpu_model(), "cores": os.cpu_count(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()], **judge_all(args.pause),
    }  # fmt: skip
    result["seconds"] = round(time.perf_counter() - started, 1)
    for key, value in result["summary"].items():
        early = f"{value['early_answers']}/{value['unfinished_pauses']}"
        waiting = f"{value['kept_waiting']}/{value['finished_questions']}"
        print(f"{key:18s} early answers {early}, kept waiting {waiting}, {value['judge_ms_p50']} ms each")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

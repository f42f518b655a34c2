"""A receptionist at conversation pace (issue 47): spoken questions about a town library's notes, asked of a
real `lipstream serve --agent --knowledge DIR --persona FILE` with the embedded models (Whisper tiny.en,
SmolLM2-135M), judged answer by answer.

    .venv/bin/python benchmarks/knowledge_desk_bench.py [--avatars-dir out/home/avatars] [--avatar sample]
        [--offline text|whisper] [--limit N] [--out benchmarks/results/knowledge_desk_bench.json]

The notes (24 documents with distractors that share their vocabulary) and the 36 questions (19 sharing words
with their answer, 12 paraphrased so that they share no content word with it, 5 the notes do not answer) are
written by benchmarks/knowledge_desk_corpus.py. Each question is spoken by one of four voices (Piper and
three espeak-ng variants no test uses) and streamed in real time by the conversation benchmark's client
(benchmarks/conversation_bench.py), one fresh session each.

Each reply is judged: **right** (an answerable question's reply holds the expected fact), **declined** (it
says the persona's "I don't have that in my notes."), **invented** (a number or a name in the reply that is
not in the notes, the persona or the question), **wrong source** (an answerable question's reply names
sources, not the document that answers it). The questions, what the server heard, the replies and their
sources are kept word for word in the results, beside the stage waterfall (a PNG).

`--offline text|whisper`: no server and no language model: the typed questions (or the WAVs transcribed by
Whisper here) go through retrieval, and the guard speaks the notes' own sentence (a stand-in model that
strays): how well retrieval and the sentence choice do, and how long a search takes, in seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the sibling scripts, by bare name
sys.path.append(str(Path(__file__).resolve().parent.parent))  # after PYTHONPATH: benchmarks.results
from bench_common import guard_alone  # noqa: E402
from conversation_bench import (  # noqa: E402
    HELDOUT_VOICES,
    STAGES,
    _write_wav,
    aggregate,
    espeak_wav,
    percentiles,
    plot,
    start_agent_server,
    stop,
    summarise,
    wer,
)
from knowledge_desk_corpus import DOCUMENTS, PERSONA, QUESTIONS, UNKNOWN, DeskQuestion, write_notes  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
# Piper (the bundled voice) and three espeak-ng variants the tests never use
VOICES: tuple[tuple[str, int], ...] = (("piper", 0), *HELDOUT_VOICES[:3])
NAME = re.compile(r"(?<![.!?]\s)(?<!^)\b[A-Z][a-z]+\b")
NUMBER = re.compile(r"\d+")


# ----- judging --------------------------------------------------------------------------------------------


def known_words() -> tuple[set[str], set[str]]:
    """The lower-case words and the numbers of the notes and the persona: what a reply may state."""
    text = " ".join(DOCUMENTS.values()) + " " + PERSONA
    return set(re.findall(r"[a-z]+", text.lower())), set(NUMBER.findall(text))


def invented(reply: str, question: str) -> list[str]:
    """Numbers and names (capitalised words inside a sentence) in `reply` that the notes, the persona and the
    question never say."""
    words, numbers = known_words()
    asked = set(re.findall(r"[a-z]+", question.lower())) | set(NUMBER.findall(question))
    out = [n for n in NUMBER.findall(reply) if n not in numbers and n not in asked]
    for sentence in re.split(r"(?<=[.!?])\s+", reply):
        for name in NAME.findall(sentence):
            if name.lower() not in words and name.lower() not in asked and name != "I":
                out.append(name)
    return list(dict.fromkeys(out))


def judge(question: DeskQuestion, reply: str, sources: list[str]) -> dict[str, Any]:
    """The verdicts on one reply (see the module's docstring)."""
    said = reply.lower().replace("’", "'")
    declined = UNKNOWN.lower() in said
    right = question.source is not None and any(f in said for f in question.fact)
    wrong_source = question.source is not None and bool(sources) and question.source not in sources
    made_up = invented(reply, question.text)
    verdict = "right" if right else "declined" if declined else "invented" if made_up else "wrong"
    if question.source is None and declined:
        verdict = "declined (right)"
    return {
        "verdict": verdict,
        "right": right,
        "declined": declined,
        "invented": made_up,
        "wrong_source": wrong_source,
    }


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Right / declined / invented / wrong-source counts, overall and by kind of question."""
    answerable = [r for r in rows if r["kind"] != "unanswered"]
    unanswered = [r for r in rows if r["kind"] == "unanswered"]
    by_kind = {
        k: f"{sum(r['right'] for r in rows if r['kind'] == k)} of {sum(r['kind'] == k for r in rows)}"
        for k in ("direct", "paraphrase")
    }
    return {
        "answerable_right": sum(r["right"] for r in answerable),
        "answerable": len(answerable),
        "answerable_right_pct": round(100 * sum(r["right"] for r in answerable) / max(1, len(answerable)), 1),
        "right_by_kind": by_kind,
        "answerable_declined": sum(r["declined"] for r in answerable),
        "unanswered_declined": sum(r["declined"] for r in unanswered),
        "unanswered": len(unanswered),
        "unanswered_declined_pct": round(
            100 * sum(r["declined"] for r in unanswered) / max(1, len(unanswered)), 1
        ),
        "invented_replies": sum(bool(r["invented"]) for r in rows),
        "wrong_source": sum(r["wrong_source"] for r in rows),
        "wer": wer([(r["question"], r["heard"] or "") for r in rows]),
    }


# ----- questions ------------------------------------------------------------------------------------------


def make_wavs(folder: Path, questions: tuple[DeskQuestion, ...]) -> list[dict[str, Any]]:
    """Each question as a WAV in its voice (round robin over VOICES), with silence around it."""
    from lipstream.talk.voices.tts import create_tts

    piper = create_tts("piper", fallback=False)
    made = []
    for i, question in enumerate(questions):
        voice, speed = VOICES[i % len(VOICES)]
        speech = (
            piper.synthesize(question.text).pcm
            if voice == "piper"
            else espeak_wav(question.text, voice, speed)
        )
        pcm = np.concatenate([np.zeros(8000, np.float32), speech, np.zeros(3200, np.float32)])
        path = folder / f"k{i:02d}.wav"
        _write_wav(path, pcm)
        made.append({"text": question.text, "voice": voice, "path": path, "question": question})
    return made


def transcribe(wavs: list[dict[str, Any]], context: str = "") -> list[str]:
    """What Whisper tiny.en (the server's recogniser) hears in each WAV, told `context` was said before."""
    import wave

    from lipstream.talk.hearing.stt import WhisperSTT

    stt = WhisperSTT(cpu_threads=2, workers=1, context=context)
    out = []
    for wav in wavs:
        with wave.open(str(wav["path"])) as f:
            pcm = np.frombuffer(f.readframes(f.getnframes()), "<i2").astype(np.float32) / 32768.0
        out.append(stt.transcribe(pcm).text.strip())
    return out


def recognition(folder: Path, notes: Path) -> dict[str, Any]:
    """WER of Whisper with and without the listening context (the persona's greeting and the notes' names,
    grounding.listening_context), in the held-out espeak-ng voices: on the questions about the notes, and on
    general questions (conversation_bench's held-out ones)."""
    from conversation_bench import HELDOUT_QUESTIONS

    from lipstream.talk.knowledge.grounding import listening_context
    from lipstream.talk.knowledge.index import KnowledgeBase
    from lipstream.talk.knowledge.persona import Persona

    kb = KnowledgeBase(notes, home=folder / "home")
    context = listening_context(kb, Persona.load(notes.parent / "ada.toml"))
    kb.close()
    sets: dict[str, list[dict[str, Any]]] = {"notes": [], "general": []}
    texts = {"notes": [q.text for q in QUESTIONS], "general": list(HELDOUT_QUESTIONS)}
    for name, questions in texts.items():
        for i, text in enumerate(questions):
            voice, speed = HELDOUT_VOICES[i % len(HELDOUT_VOICES)]
            pcm = np.concatenate([np.zeros(8000, np.float32), espeak_wav(text, voice, speed),
                                  np.zeros(3200, np.float32)])  # fmt: skip
            path = folder / f"r_{name}_{i:02d}.wav"
            _write_wav(path, pcm)
            sets[name].append({"text": text, "voice": voice, "path": path})
    out: dict[str, Any] = {"context": context, "voices": [v for v, _ in HELDOUT_VOICES]}
    for label, words_ in (("without", ""), ("with the context", context)):
        for name, wavs in sets.items():
            heard = transcribe(wavs, words_)
            out[f"{name}, {label}"] = {
                "wer": wer([(w["text"], h) for w, h in zip(wavs, heard, strict=True)]),
                "heard": [{"said": w["text"], "heard": h} for w, h in zip(wavs, heard, strict=True)],
            }
            print(f"WER {name} questions, {label}: {out[f'{name}, {label}']['wer']}", flush=True)
    return out


# ----- the two ways to ask --------------------------------------------------------------------------------


def ask_offline(notes: Path, persona_file: Path, heard: list[str], home: Path) -> list[dict[str, Any]]:
    """Retrieval and the guard's own sentence for each transcript (no model): reply, sources, search ms."""
    from lipstream.talk.knowledge.grounding import KnowledgeGrounding
    from lipstream.talk.knowledge.index import KnowledgeBase
    from lipstream.talk.knowledge.persona import Persona

    persona = Persona.load(persona_file)
    started = time.perf_counter()
    kb = KnowledgeBase(notes, home=home)
    index_ms = (time.perf_counter() - started) * 1000

    rows = []
    for text in heard:
        grounding = KnowledgeGrounding(kb, persona)
        started = time.perf_counter()
        grounding.prefetch(text.rsplit(" ", 1)[0])
        said, sources = guard_alone(grounding, persona.system_prompt(), text)
        rows.append(
            {"reply": said, "sources": sources, "retrieval_ms": (time.perf_counter() - started) * 1000}
        )
    kb.close()
    rows[0]["index_ms"] = index_ms
    return rows


def ask_server(args: argparse.Namespace, notes: Path, persona: Path, wavs: list[dict[str, Any]]) -> dict:
    """Every WAV to a real serve --agent --knowledge --persona, one fresh session each: the rows."""
    from lipstream.server.client import ClientError
    from lipstream.server.converse_client import run_converse

    extra = ["--knowledge", str(notes), "--persona", str(persona)]
    server, url, startup = start_agent_server(args.avatars_dir, extra)
    rows = []
    try:
        for i, wav in enumerate(wavs):
            try:
                report = asyncio.run(run_converse(url, args.avatar, wav["path"], timeout=40))
            except ClientError as exc:
                rows.append(
                    {
                        "text": wav["text"],
                        "voice": wav["voice"],
                        "error": str(exc),
                        "final_transcript": None,
                        "reply": "",
                        "sources": [],
                    }
                )
                print(f"  {i + 1}/{len(wavs)} ERROR {exc}", flush=True)
                continue
            row = summarise(wav, report)
            row["sources"] = list(
                dict.fromkeys(s for r in report.reply_texts for s in r.get("sources") or [])
            )
            rows.append(row)
            if args.out is not None:  # a long run keeps what it has asked so far
                args.out.with_suffix(".partial.json").write_text(json.dumps(rows, indent=1, default=str))
            print(
                f"  {i + 1}/{len(wavs)} {wav['voice']:14s} {row['speech_end_to_first_frame_ms']} ms  heard: "
                f"{row['final_transcript']!r} -> {row['reply']!r} {row['sources']}",
                flush=True,
            )
    finally:
        stop(server)
    return {"server_start_s": round(startup, 1), "rows": rows}


# ----- main -----------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Write the notes and the questions, ask them (spoken to a server, or offline), judge, record."""
    from benchmarks.results import Figure, cpu_model, record

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--avatars-dir", type=Path, default=REPO / "out" / "home" / "avatars")
    parser.add_argument("--avatar", default="sample")
    parser.add_argument(
        "--offline",
        choices=["text", "whisper"],
        default=None,
        help="no server: typed questions, or the WAVs heard by Whisper here",
    )
    parser.add_argument("--limit", type=int, default=None, help="ask only the first N questions")
    parser.add_argument("--recognition", action="store_true",
                        help="only Whisper's WER with and without the listening context")  # fmt: skip
    parser.add_argument("--out", type=Path, default=None, help="the raw JSON (default by mode)")
    args = parser.parse_args(argv)
    questions = QUESTIONS[: args.limit] if args.limit else QUESTIONS
    mode = f"offline_{args.offline}" if args.offline else "spoken"
    out = args.out or RESULTS / (
        "knowledge_desk_bench.json" if mode == "spoken" else f"knowledge_desk_{mode}_raw.json"
    )
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores), load average {os.getloadavg()}", flush=True)
    started = time.perf_counter()
    result: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "mode": mode,
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
    }
    with tempfile.TemporaryDirectory(prefix="lipstream-desk-") as tmp:
        notes, persona = write_notes(Path(tmp))
        if args.recognition:
            return record_recognition(recognition(Path(tmp), notes), args, argv)
        if args.offline == "text":
            wavs = [{"text": q.text, "voice": "typed", "question": q} for q in questions]
        else:
            wavs = make_wavs(Path(tmp), questions)
        if args.offline:
            heard = [w["text"] for w in wavs] if args.offline == "text" else transcribe(wavs)
            asked = ask_offline(notes, persona, heard, Path(tmp) / "home")
            rows = [
                {"text": w["text"], "voice": w["voice"], "final_transcript": h, **a}
                for w, h, a in zip(wavs, heard, asked, strict=True)
            ]
        else:
            served = ask_server(args, notes, persona, wavs)
            rows = served["rows"]
            result["server_start_s"] = served["server_start_s"]
    judged = []
    for wav, row in zip(wavs, rows, strict=True):
        q: DeskQuestion = wav["question"]
        judged.append(
            {
                "question": q.text,
                "kind": q.kind,
                "voice": wav["voice"],
                "expected_source": q.source,
                "fact": list(q.fact),
                "heard": row.get("final_transcript"),
                "reply": row.get("reply", ""),
                "sources": row.get("sources", []),
                **judge(q, row.get("reply", ""), row.get("sources", [])),
                **{k: v for k, v in row.items() if k not in ("text", "voice", "reply", "sources")},
            }
        )
    result["summary"] = summary(judged)
    result["questions"] = judged
    result["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    result["bench_seconds"] = round(time.perf_counter() - started, 1)
    figures = figures_of(result, Figure)
    if mode == "spoken":
        served_rows = [r for r in judged if "error" not in r]
        result.update(aggregate([{**r, "text": r["question"]} for r in served_rows]))
        result["modes"] = {
            "knowledge desk": {**result, "questions": [{**r, "text": r["question"]} for r in served_rows]}
        }
        lat, st = result["latency_ms"]["speech_end_to_first_frame_ms"], result["stages_since_speech_end_ms"]
        figures += [
            Figure("end of speech -> first answer frame p50", lat["p50"], "ms", "<= 800"),
            Figure("end of speech -> first answer frame p90", lat["p90"], "ms", "<= 1100"),
            Figure("turn decision after end of speech p50", st["decision"]["p50"], "ms", "<= 350"),
        ]
    else:
        ms = [r["retrieval_ms"] for r in judged]
        result["retrieval_ms"] = percentiles(ms)
        figures.append(Figure("retrieval + guard a question p50 (24 notes)", statistics.median(ms), "ms"))
    print_result(result)
    out.parent.mkdir(parents=True, exist_ok=True)
    modes = result.pop("modes", None)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    if modes:
        plot({"modes": modes, "cpu": result["cpu"], "cores": result["cores"]}, out.with_suffix(".png"))
    command = "python -m benchmarks knowledge_desk " + " ".join(argv if argv is not None else sys.argv[1:])
    record(
        "knowledge_desk" if mode == "spoken" else f"knowledge_desk_{mode}",
        [f for f in figures if f.value is not None],
        command.strip(),
        {"json": str(out)},
    )
    print(f"wrote {out}")
    return 0


def record_recognition(result: dict[str, Any], args: argparse.Namespace, argv: list[str] | None) -> int:
    """Write the recognition comparison and record its WERs."""
    from benchmarks.results import Figure, record

    out = args.out or RESULTS / "knowledge_desk_recognition_raw.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    wers = {key: value["wer"] for key, value in result.items() if isinstance(value, dict)}
    figures = [Figure(f"WER, {key} (held-out espeak-ng voices)", v, "ratio") for key, v in wers.items() if v]
    command = "python -m benchmarks knowledge_desk " + " ".join(argv if argv is not None else sys.argv[1:])
    record("knowledge_desk_recognition", figures, command.strip(), {"json": str(out)})
    return 0


def figures_of(result: dict[str, Any], figure: Any) -> list[Any]:
    """The headline figures: answers right, questions declined, replies with invented facts, wrong sources."""
    s = result["summary"]
    return [
        figure("answerable questions answered right", s["answerable_right_pct"], "%", ">= 85"),
        figure("unanswerable questions declined", s["unanswered_declined_pct"], "%", ">= 90"),
        figure("replies with an invented number or name", s["invented_replies"], "replies", "0"),
        figure("replies citing the wrong document", s["wrong_source"], "replies"),
    ]


def print_result(result: dict[str, Any]) -> None:
    """Every question, what was heard and said, the verdict; then the summary."""
    for r in result["questions"]:
        print(
            f"[{r['verdict']:>16s}] {r['question']}\n    heard: {r['heard']}\n    reply: {r['reply']}\n"
            f"    sources: {r['sources']} (expected {r['expected_source']})"
            + (f" INVENTED {r['invented']}" if r["invented"] else "")
        )
    print(json.dumps(result["summary"], indent=1))
    if "latency_ms" in result:
        lat = result["latency_ms"]["speech_end_to_first_frame_ms"]
        print(f"end of speech -> first answer frame p50 {lat['p50']} ms, p90 {lat['p90']} ms")
        for stage in STAGES:
            value = result["stages_since_speech_end_ms"][stage]
            print(f"   stage {stage:20s} p50 {value['p50']}  p90 {value['p90']}")
    if "retrieval_ms" in result:
        print(f"retrieval + guard a question: {result['retrieval_ms']}")


if __name__ == "__main__":
    raise SystemExit(main())

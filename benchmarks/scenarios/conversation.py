"""The conversation loop's figures (issue 9): scripted spoken questions streamed in real time to a real
`lipstream serve --agent` process; latency from the end of the user's speech to the avatar's first answer
frame at the client, by stage, with the embedded model and with an instant-first-token OpenAI endpoint;
the STT word error rate; the server's memory idle, with one conversation and with two at once.

    .venv/bin/python -m benchmarks conversation [--avatars-dir out/home/avatars] [--avatar sample]
        [--modes embedded fake] [--questions 12] [--width W]
        [--out benchmarks/results/conversation_bench.json]

Each question is a WAV (Piper and espeak-ng voices, alternately) streamed by `lipstream client --converse`'s
code (server/converse_client.py): 20 ms chunks at real-time pace, silence after it, a simulated player
(150 ms jitter buffer) reporting its position. Every question gets a fresh session, so no answer depends on
an earlier one. The end of the user's speech is where the WAV's energy ends (the client's own figure), taken
at the moment the chunk holding its last sample left the client. Writes JSON and a PNG next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_common import child_pids, cpu_model, rss_mib, served_avatar_manifest

import lipstream
from benchmarks.scenarios.conversation_figures import aggregate, count_rules, paused_summary, plot, summarise
from benchmarks.scenarios.conversation_questions import (
    BARGE_IN_NOTE,
    make_heldout_questions,
    make_paused_questions,
    make_questions,
)
from benchmarks.scenarios.conversation_servers import (
    FAKE_REPLY,
    MAX_REPLY_TOKENS,
    RssSampler,
    start_agent_server,
    start_fake_llm,
    start_local_llm,
    stop,
)
from lipstream.server.client import ClientError

try:
    from lipstream.server.converse_client import run_converse
except ImportError:  # a tree from before the rename (before/after runs with this script)
    from lipstream.server.converse import run_converse  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
# the lipstream this process imports: its server is the one measured (PYTHONPATH picks the tree, so
# before_after.py --script-from-after measures an older tree with this script and its questions)
TREE = Path(lipstream.__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"


async def ask(url: str, avatar: str, question: dict[str, Any], width: int | None) -> dict[str, Any]:
    """One question in a fresh session: the client's report, reduced to what the bench uses."""
    try:
        report = await run_converse(url, avatar, question["path"], output_width=width, timeout=60)
    except ClientError as exc:
        return {"text": question["text"], "voice": question["voice"], "error": str(exc)}
    return summarise(question, report)


def run_mode(
    mode: str, args: argparse.Namespace, questions: list[dict[str, Any]], rule: str = "text",
    paused: list[dict[str, Any]] | None = None, recognition: str = "batch",
) -> dict[str, Any]:
    """Start a server for `mode` ("embedded" or "fake") with the turn rule `rule` and the `recognition`
    ("batch": the turn decoded once it ends; "streaming": `--streaming-stt`), ask every question (and the
    paused ones), measure memory; the results."""
    llm_proc = None
    extra: list[str] = ["--turn-detector", rule, *(["--streaming-stt"] if recognition == "streaming" else [])]
    extra += ["--voice", args.voice]
    env = None
    if mode == "fake":
        llm_proc, llm_url = start_fake_llm()
        extra += ["--llm-url", llm_url]
    elif mode == "local":
        llm_proc, llm_url, key = start_local_llm()
        extra += ["--llm-url", llm_url]
        env = {**os.environ, "LIPSTREAM_LLM_KEY": key}
    load_start = os.getloadavg()
    server, url, startup = start_agent_server(args.avatars_dir, extra, env)
    rss = RssSampler(server.pid)
    try:
        time.sleep(2.0)  # settle after loading
        rss.reset()
        time.sleep(1.0)
        idle = rss.peak_mib()
        idle_children = round(sum(rss_mib(c) for c in child_pids(server.pid)), 1)  # the model process
        hwm_start = rss.hwm_mib()
        rss.reset()
        rows = []
        first = None
        for i, question in enumerate(questions):
            row = asyncio.run(ask(url, args.avatar, question, args.width))
            rows.append(row)
            first = rss.peak_mib() if first is None else first
            shown = row.get("speech_end_to_first_frame_ms", row.get("error"))
            print(f"  [{mode}] {i + 1}/{len(questions)} {question['voice']:6s} {shown} ms  "
                  f"heard: {row.get('final_transcript')!r}", flush=True)  # fmt: skip
        one = rss.peak_mib()
        paused_rows = []
        for i, question in enumerate(paused or []):
            row = asyncio.run(ask(url, args.avatar, question, args.width))
            paused_rows.append(row)
            print(f"  [{mode}/{rule}] paused {i + 1}/{len(paused)} {question['voice']:6s} early="
                  f"{row.get('answered_early')} ends={row.get('early_turn_ends')} rule={row.get('end_rule')} "
                  f"heard: {row.get('final_transcript')!r}", flush=True)  # fmt: skip
        time.sleep(1.0)
        rss.reset()
        idle_after = rss.peak_mib()  # idle again: what the sessions left behind

        async def two() -> list[dict[str, Any]]:
            return list(await asyncio.gather(*(ask(url, args.avatar, q, args.width) for q in questions[:2])))

        pair = asyncio.run(two())
        both = rss.peak_mib()
        hwm_end = rss.hwm_mib()
    finally:
        rss.close()
        stop(server)
        if llm_proc is not None:
            stop(llm_proc)
    result = {
        "llm": {
            "embedded": "embedded SmolLM2-135M-Instruct (llama.cpp)",
            "local": "--llm-url: SmolLM2-135M-Instruct behind a local OpenAI-compatible server (llm_child)",
            "fake": f"OpenAI-compatible fake (tests/fake_llm_server.py, first token at once): {FAKE_REPLY!r}",
        }[mode],
        "server_args": ["--agent", "--max-reply-tokens", str(MAX_REPLY_TOKENS), *extra],
        "server_start_seconds": round(startup, 1),
        "load_average_start": [round(x, 2) for x in load_start],
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        **aggregate(rows),
        "turn_rule": rule,
        "recognition": recognition,
        "paused_questions": paused_summary(paused_rows) if paused else None,
        "paused_rows": paused_rows,
        "end_rules": count_rules(rows),
        "two_at_once": {
            "speech_end_to_first_frame_ms": [r.get("speech_end_to_first_frame_ms") for r in pair],
            "errors": [r["error"] for r in pair if "error" in r],
        },
        "rss_mib": {
            "idle": idle,
            "idle_child_processes": idle_children,
            "idle_with_child_processes": round(idle + idle_children, 1),
            "first_conversation_peak": first,
            "one_conversation_peak": one,
            "idle_after_the_questions": idle_after,
            "two_conversations_peak": both,
            "per_extra_conversation": round(both - one, 1),
            "vmhwm_after_start": hwm_start,
            "vmhwm_end": hwm_end,
        },
        "questions": rows,
    }
    return result


def main(argv: list[str] | None = None) -> int:
    """Make the questions, run each mode, print and write JSON + PNG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--avatars-dir", type=Path, default=REPO / "out" / "home" / "avatars")
    parser.add_argument("--avatar", default="sample")
    parser.add_argument(
        "--modes", nargs="+", default=["embedded", "local"], choices=["embedded", "local", "fake"],
        help="embedded: the bundled SmolLM2 in the server's child process; local: --llm-url to SmolLM2 "
        "behind "
        "a local OpenAI-compatible server; fake: --llm-url to a server whose first token is instant",
    )
    parser.add_argument(
        "--voices", choices=["heldout", "scripted"], default="heldout",
        help="heldout: questions and espeak-ng voice variants no test uses; scripted: Piper and espeak-ng",
    )
    parser.add_argument("--questions", type=int, default=12)
    parser.add_argument("--paused", type=int, default=12, help="questions paused mid-clause (0: none)")
    parser.add_argument(
        "--rules", nargs="+", default=["text", "silence"], choices=["text", "smart-turn", "silence"],
        help="turn rules to compare, each in its own server, in one run",
    )
    parser.add_argument(
        "--recognition", nargs="+", default=["batch"], choices=["batch", "streaming"],
        help="batch: the turn decoded when it ends; streaming: serve --streaming-stt (text committed as the "
        "user speaks, the tail decoded at the end); each in its own server, side by side",
    )
    parser.add_argument("--width", type=int, default=None, help="stream width (default: the avatar's own)")
    parser.add_argument("--voice", default="piper", choices=["piper", "espeak"], help="the avatar's voice")
    parser.add_argument("--out", type=Path, default=RESULTS / "conversation_bench.json")
    args = parser.parse_args(argv)
    if args.questions < 10:
        parser.error("--questions: at least 10")
    manifest = served_avatar_manifest(args.avatars_dir, args.avatar)
    started = time.perf_counter()
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores), load average {os.getloadavg()}", flush=True)
    results: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_average_start": [round(x, 2) for x in os.getloadavg()],
        "avatar": args.avatar,
        "stream_width": args.width or manifest["width"],
        "voice": args.voice,
        "avatar_size": f"{manifest['width']}x{manifest['height']}",
        "end_of_turn_silence_ms": 500,
        "turn_rules": "text: the pause's transcript judged by the embedded SmolLM2 (answer after 200 ms of "
        "silence when judged finished, else wait up to 1600 ms); silence: 500 ms of silence; smart-turn: the "
        "Smart Turn v3.2 audio model instead of the text judge",
        "player_jitter_buffer_ms": 150,
        "definitions": {
            "speech_end": "where the question WAV's energy ends (20 ms windows above max(-45 dBFS, "
            "peak-30 dB)), at the moment the pcm chunk holding its last sample left the client",
            "speech_end_to_first_frame_ms": "speech end -> first speech video frame of the answer received",
            "speech_end_to_first_frame_shown_ms": "speech end -> when a player with a 150 ms jitter buffer "
            "shows that frame (its arrival when it came late)",
            "end_of_turn_to_first_frame_ms": "arrival of user_speech_ended (after the 500 ms end-of-turn "
            "silence, which is policy, not overhead) -> first speech frame received",
            "speech_end_to_end_of_turn_ms": "speech end -> arrival of user_speech_ended",
            "server_speech_end_to_first_frame_ms": "same as speech_end_to_first_frame_ms, from the server "
            "VAD's end of speech (user_speech_ended.mic_samples) on the client's send clock: the base of "
            "the turn_metrics stages",
            "stages_since_speech_end_ms": "turn_metrics from the server: ms since the end of speech reached "
            "it, to the final transcript, the LLM's first token, the first TTS audio, the first frame sent",
            "delivery_ms": "server_speech_end_to_first_frame_ms - turn_metrics.first_frame",
            "vad_end_offset_ms": "server VAD end of speech - WAV energy end",
            "wer": "word-level Levenshtein over normalised lower-case words, all edits / all reference words",
            "rss_mib": "server VmRSS sampled every 50 ms: idle after start, peak during the first question, "
            "peak over the sequential questions (one conversation at a time), idle after them, peak with two "
            "at once; per_extra_conversation = two_conversations_peak - one_conversation_peak",
        },
        "barge_in_ms": None,
        "barge_in_note": BARGE_IN_NOTE,
        "modes": {},
    }
    with tempfile.TemporaryDirectory(prefix="lipstream-convbench-") as tmp:
        make = make_heldout_questions if args.voices == "heldout" else make_questions
        questions = make(Path(tmp), args.questions)
        paused = make_paused_questions(Path(tmp), args.paused) if args.paused else []
        results["questions"] = [{k: q[k] for k in ("text", "voice", "seconds")} for q in questions]
        results["paused_questions"] = [{k: q[k] for k in ("text", "voice", "pause_s")} for q in paused]
        for mode in args.modes:
            for rule in args.rules:  # side by side, in one run: the machine's load drifts
                for recognition in args.recognition:
                    key = f"{mode} / {rule}" + (" / streaming" if recognition == "streaming" else "")
                    print(f"{key}: starting the server", flush=True)
                    results["modes"][key] = run_mode(mode, args, questions, rule, paused, recognition)
                    report_mode(key, results["modes"][key])
    results["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    results["bench_seconds"] = round(time.perf_counter() - started, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    plot(results, args.out.with_suffix(".png"))
    print(f"load average at the end {os.getloadavg()}; {results['bench_seconds']} s")
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    record_figures(results, args)
    return 0


def record_figures(results: dict[str, Any], args: argparse.Namespace) -> None:
    """The headline figures in the shared results schema (benchmarks/results.py), when it is there; the
    headline is Piper's: a run in another voice is written to --out only."""
    if args.voice != "piper":
        print(f"voice {args.voice}: figures in {args.out} only (the recorded headline is Piper's)")
        return
    try:
        from benchmarks.results import Figure, record
    except ImportError:
        return
    figures = []
    for mode, res in results["modes"].items():
        frame = res["latency_ms"]["speech_end_to_first_frame_ms"]
        transcript = res["stages_since_speech_end_ms"]["transcript"]
        figures += [
            Figure(f"end of speech -> first answer frame p50 ({mode})", frame["p50"], "ms", "<= 800"),
            Figure(f"end of speech -> first answer frame p90 ({mode})", frame["p90"], "ms", "<= 1100"),
            Figure(f"final transcript after end of speech p50 ({mode})", transcript["p50"], "ms", "<= 200"),
            Figure(f"WER on held-out questions ({mode})", res["wer"]["all"], "ratio", "no worse than before"),
        ]
    command = "python -m benchmarks conversation " + " ".join(argv_of(args))
    kept = [f for f in figures if f.value is not None]
    record("conversation", kept, command, extra={"json": str(args.out)})


def argv_of(args: argparse.Namespace) -> list[str]:
    """The options this run was given, for the record's command line."""
    return [
        "--modes", *args.modes, "--rules", *args.rules, "--recognition", *args.recognition,
        "--voices", args.voices, "--questions", str(args.questions), "--paused", str(args.paused),
    ]  # fmt: skip


def report_mode(mode: str, res: dict[str, Any]) -> None:
    """Print one mode's headline figures."""
    lat, st = res["latency_ms"], res["stages_since_speech_end_ms"]
    print(f"== {mode}: {res['llm']}; load {res['load_average_start']} -> {res['load_average_end']}")
    print(f"   answered {res['answered']}; WER {res['wer']}; speculation {res['speculation_used']}")
    for key, value in lat.items():
        print(f"   {key:40s} p50 {value['p50']}  p90 {value['p90']}  p95 {value['p95']}")
    for key, value in st.items():
        print(f"   stage {key:34s} p50 {value['p50']}  p90 {value['p90']}")
    print(f"   rss MiB {res['rss_mib']}; two at once: {res['two_at_once']}")
    print(f"   end rules {res['end_rules']}; paused questions: {res['paused_questions']}")


if __name__ == "__main__":
    raise SystemExit(main())

"""Several spoken conversations at once (issue 49): N visitors (N = 1, 2, 3, 4, 6 by default, one round each,
in ascending order) talk to ONE real `lipstream serve --agent` process with the embedded models (the shared
recogniser and model processes), each in its own voice with its own questions, starting `--stagger` seconds
apart so that their speech and the server's work overlap. Per N: end of speech -> first answer frame p50,
p90 and worst; the stage waterfall (the p50 of each turn_metrics stage); each process's CPU over the round
(the server and every process under it, psutil); and whether every reply answered its own question.

    .venv/bin/python -m benchmarks conversations [--avatars-dir out/home/avatars] [--avatar sample]
        [--counts 1 2 3 4 6] [--questions-per-visitor 3] [--stagger 0.4] [--width W]
        [--server-arg=--max-conversations=2 ...]

A visitor is `lipstream client --converse`'s code (server/converse_client.run_converse): 20 ms microphone
chunks at real-time pace, a simulated player reporting its position, the answer recorded. run_converse asks
one question per session, so a visitor asks its questions one after the other, each in a fresh session opened
as soon as the previous answer has played (one session per question). The clients never decode video: they
keep the H.264 access units as they come (and the audio is raw PCM), so their own cost in this process is a
few per cent of a core (reported as `clients (this process)`) and the server's cores are what is measured;
`--width` only sets the size the server encodes (default: the avatar's own, what the page asks for).

Visitor i has the i-th voice (Piper, espeak-ng and espeak-ng variants no test uses, alternately) and the i-th
set of questions; each question has keywords (its topic and its answer) no other visitor's question shares.
A turn is `crossed` when the final transcript the client received is nearer another visitor's question of
that round than its own (word edits over the question's words), or the reply names another visitor's
keyword; `answered_own` when neither, the transcript is nearest its own question and the reply names one of
its own keywords. Before the rounds, one warm-up turn (not counted) wakes the models.

Records its figures in benchmarks/results/conversations.json (the results schema; every turn in `extra`)
and draws benchmarks/results/conversations.png: latency per N, the waterfall per N, cores per process per N.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench_common import cpu_model, served_avatar_manifest
from rich.progress import Progress

from benchmarks.scenarios.conversation_figures import summarise
from benchmarks.scenarios.conversation_servers import MAX_REPLY_TOKENS, start_agent_server, stop
from benchmarks.scenarios.conversations_parts import (
    CLIENTS,
    MAX_QUESTIONS,
    MAX_VISITORS,
    cpu_delta,
    cpu_snapshot,
    judge_turn,
    make_visitors,
    plot,
    summarise_round,
)
from lipstream.server.client import ClientError
from lipstream.server.converse_client import run_converse

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
SCENARIO = "conversations"
KEEP = ("visitor", "question", "voice", "text", "started_s", "ended_s", "final_transcript", "reply",
        "speech_end_to_first_frame_ms", "speech_end_to_first_frame_shown_ms", "end_of_turn_to_first_frame_ms",
        "turn_metrics_ms", "end_rule", "errors", "error", "player_stall_ms",
        "in_line", "waited", "waited_ms", "wait_seen_ms", "wait_heard_ms",  # a visitor beyond the seats
        # what judge_turn adds
        "transcript_distance_own", "transcript_nearer_another", "transcript_own", "reply_own_keywords",
        "reply_other_keywords", "crossed", "answered_own")  # fmt: skip


async def ask(
    url: str, avatar: str, question: dict[str, Any], width: int | None, timeout: float, stream: str = "full"
) -> dict:
    """One question in a fresh session: the client's figures (conversation_figures.summarise) or its error."""
    try:
        report = await run_converse(
            url, avatar, question["path"], output_width=width, timeout=timeout, stream=stream
        )
    except ClientError as exc:
        return {"text": question["text"], "voice": question["voice"], "error": str(exc)}
    except Exception as exc:  # noqa: BLE001 - one failed turn is a figure of the round, not the end of the run
        return {"text": question["text"], "voice": question["voice"], "error": f"{type(exc).__name__}: {exc}"}
    row = summarise(question, report)
    # a visitor beyond the server's seats (--max-conversations): told to wait, answered once a seat freed
    waited_ms = (report.turn_metrics or {}).get("waited_ms")
    row.update(
        in_line=report.waited, waited=waited_ms is not None, waited_ms=waited_ms,
        wait_seen_ms=report.speech_end_to_wait_seen_ms, wait_heard_ms=report.speech_end_to_wait_heard_ms,
    )
    return row


async def visit(
    url: str, args: argparse.Namespace, visitor: dict[str, Any], t0: float, done: Callable[[dict], None]
) -> list[dict]:
    """One visitor: wait its turn in the stagger, then ask its questions one after the other."""
    await asyncio.sleep(visitor["visitor"] * args.stagger)
    rows = []
    for j, question in enumerate(visitor["questions"]):
        started = time.perf_counter() - t0
        row = await ask(url, args.avatar, question, args.width, args.timeout, args.stream)
        row.update(visitor=visitor["visitor"], question=j, started_s=round(started, 2),
                   ended_s=round(time.perf_counter() - t0, 2))  # fmt: skip
        rows.append(row)
        done(row)
    return rows


def run_round(
    url: str,
    server_pid: int,
    args: argparse.Namespace,
    visitors: list[dict[str, Any]],
    progress: Progress,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """N visitors at once: every turn judged against the other visitors' questions, and the round's figures
    (CPU from just before the first visitor starts to after the last answer has played)."""
    n = len(visitors)
    task = progress.add_task(f"N={n}", total=sum(len(v["questions"]) for v in visitors))

    def done(row: dict[str, Any]) -> None:
        shown = row.get("speech_end_to_first_frame_ms", row.get("error"))
        heard, reply = row.get("final_transcript"), (row.get("reply") or "")[:70]
        who = f"visitor {row['visitor']} ({row['voice']}) q{row['question']}"
        progress.console.print(f"  N={n} {who}: {shown} ms; heard {heard!r}; reply {reply!r}")
        progress.advance(task)

    async def together(t0: float) -> list[dict[str, Any]]:
        done_rows = await asyncio.gather(*(visit(url, args, v, t0, done) for v in visitors))
        return [row for rows in done_rows for row in rows]

    before, client_cpu = cpu_snapshot(server_pid), time.process_time()
    t0 = time.perf_counter()
    rows = asyncio.run(together(t0))
    wall = time.perf_counter() - t0
    cpu = cpu_delta(before, cpu_snapshot(server_pid))
    cpu[CLIENTS] = round(time.process_time() - client_cpu, 2)
    for row in rows:
        own = visitors[row["visitor"]]["questions"][row["question"]]
        others = [q for v in visitors if v["visitor"] != row["visitor"] for q in v["questions"]]
        row.update(judge_turn(row, own, others))
    rows = [{k: row[k] for k in KEEP if k in row} for row in rows]
    rows.sort(key=lambda r: (r["visitor"], r["question"]))
    return summarise_round(n, rows, cpu, wall), rows


def report(summary: dict[str, Any]) -> None:
    """Print one round's figures."""
    lat, st = summary["speech_end_to_first_frame_ms"], summary["stages_since_speech_end_ms"]
    print(f"== N={summary['visitors']}: {summary['turns']} turns in {summary['wall_s']} s, "
          f"{len(summary['failed'])} failed, {summary['no_first_frame']} without a first frame; end of "
          f"speech -> first frame p50 {lat['p50']} p90 {lat['p90']} worst {lat['worst']} ms")  # fmt: skip
    print("   stages p50: " + ", ".join(f"{s} {v['p50']}" for s, v in st.items()))
    print("   CPU s: " + ", ".join(f"{k} {v}" for k, v in summary["cpu_seconds"].items())
          + f"; server and its processes {summary['server_and_its_processes_cores']} cores")  # fmt: skip
    waits = summary["waiting"]
    if waits["turns"]:
        seated = summary["speech_end_to_first_frame_seated_ms"]
        print(f"   {waits['turns']} turns waited for a seat: wait seen p50 {waits['seen_ms']['p50']} worst "
              f"{waits['seen_ms']['worst']} ms, heard p50 {waits['heard_ms']['p50']} worst "
              f"{waits['heard_ms']['worst']} ms; turns not waiting: first frame p50 {seated['p50']} p90 "
              f"{seated['p90']} worst {seated['worst']} ms")  # fmt: skip
    stall = summary["player_stall_ms"]
    print(f"   the player waited for late frames (an answer's audio ran dry): in {summary['turns_stalled']} "
          f"of {summary['turns']} turns, worst {stall['worst']} ms")  # fmt: skip
    print(f"   crossed {summary['crossed']}, answered own {summary['answered_own']} of {summary['turns']}, "
          f"transcript nearest its own question {summary['transcript_own']}")  # fmt: skip
    for failure in summary["failed"]:
        print(f"   FAILED visitor {failure['visitor']} {failure['text']!r}: {failure['error']}")


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The options, checked."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--avatars-dir", type=Path, default=REPO / "out" / "home" / "avatars")
    parser.add_argument("--avatar", default="sample")
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 2, 3, 4, 6],
                        help=f"conversations at once, a round each (1-{MAX_VISITORS})")  # fmt: skip
    parser.add_argument("--questions-per-visitor", type=int, default=3,
                        help=f"questions a visitor asks, one by one (1-{MAX_QUESTIONS})")  # fmt: skip
    parser.add_argument("--stagger", type=float, default=0.4, help="seconds between visitors' starts")
    parser.add_argument("--width", type=int, default=None,
                        help="stream width the server encodes (default: the avatar's own); the clients never "
                        "decode video, whatever the width")  # fmt: skip
    parser.add_argument("--stream", default="full", choices=["full", "patch"],
                        help="whole frames (what client --converse and the integrations take) or the mouth "
                        "patches the page plays (the server encodes only the mouth)")  # fmt: skip
    parser.add_argument("--voice", default="piper", choices=["piper", "espeak"], help="the avatar's voice")
    parser.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="one more argument for `lipstream serve --agent` (repeat it; write "
                        "--server-arg=--max-conversations=2 for one that starts with --)")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a turn's answer may take")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds of quiet before each round")
    parser.add_argument("--out", type=Path, default=None,
                        help="also write each round's summary here as JSON (what `python -m benchmarks "
                        "before_after` compares)")  # fmt: skip
    args = parser.parse_args(argv)
    if any(not 1 <= n <= MAX_VISITORS for n in args.counts):
        parser.error(
            f"--counts: each between 1 and {MAX_VISITORS} (there are {MAX_VISITORS} visitors' voices)"
        )
    if not 1 <= args.questions_per_visitor <= MAX_QUESTIONS:
        parser.error(f"--questions-per-visitor: between 1 and {MAX_QUESTIONS}")
    args.counts = sorted(set(args.counts))
    return args


def main(argv: list[str] | None = None) -> int:
    """Make the visitors, start the server, run each N, print, plot and record."""
    given = list(sys.argv[1:] if argv is None else argv)
    args = parse(given)
    manifest = served_avatar_manifest(args.avatars_dir, args.avatar)
    began = time.perf_counter()
    print(f"CPU: {cpu_model()} ({os.cpu_count()} cores), load average {os.getloadavg()}", flush=True)
    server_args = ["--voice", args.voice, *args.server_arg]
    rounds, turns = [], {}
    with tempfile.TemporaryDirectory(prefix="lipstream-conversations-") as tmp:
        visitors, warm_question = make_visitors(Path(tmp), max(args.counts), args.questions_per_visitor)
        server, url, startup = start_agent_server(args.avatars_dir, server_args)
        print(f"server up in {startup:.1f} s: {url}; server args {server_args}", flush=True)
        try:
            time.sleep(args.settle)
            warm = asyncio.run(ask(url, args.avatar, warm_question, args.width, args.timeout, args.stream))
            print(f"warm-up: {warm.get('speech_end_to_first_frame_ms', warm.get('error'))} ms, heard "
                  f"{warm.get('final_transcript')!r}", flush=True)  # fmt: skip
            with Progress() as progress:
                for n in args.counts:
                    time.sleep(args.settle)
                    if server.poll() is not None:
                        raise RuntimeError(f"the server exited ({server.returncode}) before N={n}")
                    summary, rows = run_round(url, server.pid, args, visitors[:n], progress)
                    summary["load_average_end"] = round(os.getloadavg()[0], 2)
                    rounds.append(summary)
                    turns[n] = rows
                    progress.console.print(f"N={n} done")
        finally:
            stop(server)
    for summary in rounds:
        report(summary)
    png = RESULTS / f"{SCENARIO}.png"
    RESULTS.mkdir(parents=True, exist_ok=True)
    width = args.width or manifest["width"]
    plot(rounds, turns, f"{len(rounds)} rounds of N conversations at once against one serve --agent "
         f"({'patch stream' if args.stream == 'patch' else f'{width} px wide'}, "
         f"{args.questions_per_visitor} questions a visitor, {args.stagger} s stagger) — "
         f"{cpu_model()}, {os.cpu_count()} cores", png)  # fmt: skip
    print(f"wrote {png}; {time.perf_counter() - began:.0f} s in all")
    extra = {
        "png": str(png.relative_to(REPO)),
        "avatar": args.avatar,
        "avatar_size": f"{manifest['width']}x{manifest['height']}",
        "stream_width": width,
        "stream": args.stream,
        "server_args": ["--agent", "--max-reply-tokens", str(MAX_REPLY_TOKENS), *server_args],
        "server_start_seconds": round(startup, 1),
        "stagger_s": args.stagger,
        "questions_per_visitor": args.questions_per_visitor,
        "sessions": "one fresh session a question (run_converse asks one question a session), the next "
        "opened as soon as the previous answer has played; the clients keep video undecoded",
        "visitors": [
            {
                "visitor": v["visitor"],
                "voice": v["voice"],
                "questions": [{k: q[k] for k in ("text", "keywords", "seconds")} for q in v["questions"]],
            }
            for v in visitors
        ],
        "warm_up": {
            k: warm.get(k) for k in ("speech_end_to_first_frame_ms", "final_transcript", "reply", "error")
        },
        "rounds": rounds,
        "turns": {str(n): rows for n, rows in turns.items()},
        "bench_seconds": round(time.perf_counter() - began, 1),
    }
    if args.out is not None:
        args.out.write_text(json.dumps({"rounds": rounds, "bench_seconds": extra["bench_seconds"]}, indent=1))
    record_figures(rounds, given, extra)
    return 0 if all(not r["failed"] and not r["crossed"] for r in rounds) else 1


def record_figures(rounds: list[dict[str, Any]], given: list[str], extra: dict[str, Any]) -> None:
    """The headline figures in the results schema: p50, p90 and worst per N; crossed and answered turns over
    all rounds; the cores of the server and its processes at the largest N."""
    from benchmarks.results import Figure, record

    figures = []
    for summary in rounds:
        n, lat = summary["visitors"], summary["speech_end_to_first_frame_ms"]
        for key in ("p50", "p90", "worst"):
            if lat[key] is not None:
                figures.append(
                    Figure(f"end of speech -> first answer frame {key}, {n} at once", lat[key], "ms")
                )
        seated, waits = summary["speech_end_to_first_frame_seated_ms"], summary["waiting"]
        if waits["turns"]:  # beyond the seats: the seated turns' pace, and how soon the others heard the wait
            figures += [
                Figure(f"first answer frame p50 of turns not waiting, {n} at once", seated["p50"], "ms"),
                Figure(f"first answer frame p90 of turns not waiting, {n} at once", seated["p90"], "ms"),
                Figure(f"wait shown (state) worst, {n} at once", waits["seen_ms"]["worst"], "ms", "<= 300"),
                Figure(f"wait heard (the wait line's first frame) p50, {n} at once",
                       waits["heard_ms"]["p50"], "ms"),
            ]  # fmt: skip
    figures = [f for f in figures if f.value is not None]
    turns = sum(r["turns"] for r in rounds)
    figures += [
        Figure("turns crossed into another visitor's, all rounds", sum(r["crossed"] for r in rounds), "turns",
               "0"),
        Figure("replies answering their own question, all rounds", sum(r["answered_own"] for r in rounds),
               f"of {turns}"),
        Figure(f"server and its processes, {rounds[-1]['visitors']} at once",
               rounds[-1]["server_and_its_processes_cores"], "cores"),
    ]  # fmt: skip
    record(SCENARIO, figures, " ".join(["python -m benchmarks", SCENARIO, *given]), extra=extra)


if __name__ == "__main__":
    raise SystemExit(main())

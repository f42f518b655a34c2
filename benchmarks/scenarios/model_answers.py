"""Answers asked of the embedded model process at once (issue 49 item 3): the model alone, no server.

    .venv/bin/python -m benchmarks model_answers [--counts 1 2 3 4] [--rounds 3] [--stagger 0.15]
        [--out benchmarks/results/model_answers_bench.json]

N clients ask the model process (`EmbeddedChatModel`, what `serve --agent` uses) N different questions,
`--stagger` seconds apart, each with a conversation's prompt (a system prompt and a short history, so the
prompts share a start), 40 tokens at most, as the agent asks. Per N, over the rounds: the time from each
question to its first token and to its first phrase (its 8th token, or its end if shorter: what the voice
waits for), to its whole answer, and the tokens written per second by all answers together. Measures the
lipstream this process imports, so two trees compare with

    .venv/bin/python -m benchmarks before_after --before REV model_answers

Writes the JSON and a PNG (first phrase per N) next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_common import cpu_model, talk_model

import lipstream

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
SYSTEM = "You are Ada, a friendly guide at the science museum. Answer in one or two short sentences."
HISTORY = [("user", "Hello there!"), ("assistant", "Hello! Welcome to the museum. What would you like?")]
QUESTIONS = ["Why is the sky blue?", "What do bees eat?", "Where do penguins live?", "How do bees fly?",
             "What is a black hole?", "Why do cats purr?"]  # fmt: skip
FIRST_PHRASE_TOKENS = 8
MAX_TOKENS = 40


async def ask(model: Any, question: str, delay: float) -> dict[str, float]:
    """One question after `delay` s: ms to its first token, its first phrase, its end; tokens written."""
    ChatMessage = talk_model("llm").ChatMessage
    await asyncio.sleep(delay)
    history = [ChatMessage(role, text) for role, text in HISTORY]
    messages = [ChatMessage("system", SYSTEM), *history, ChatMessage("user", question)]
    asked = time.perf_counter()
    times = []
    async for _ in model.stream(messages, MAX_TOKENS):
        times.append(time.perf_counter())
    phrase = times[min(FIRST_PHRASE_TOKENS, len(times)) - 1]
    return {"first_token_ms": (times[0] - asked) * 1000, "first_phrase_ms": (phrase - asked) * 1000,
            "answer_ms": (times[-1] - asked) * 1000, "tokens": len(times)}  # fmt: skip


async def round_of(model: Any, count: int, stagger: float, offset: int) -> tuple[list[dict], float]:
    """`count` questions at once (staggered); their figures and the round's wall seconds."""
    started = time.perf_counter()
    asked = [QUESTIONS[(offset + i) % len(QUESTIONS)] for i in range(count)]
    rows = await asyncio.gather(*(ask(model, q, i * stagger) for i, q in enumerate(asked)))
    return list(rows), time.perf_counter() - started


def summary(rows: list[dict[str, float]], walls: list[float]) -> dict[str, float]:
    """p50 / p90 / worst of each figure, and the tokens per second all answers wrote together."""
    out: dict[str, float] = {}
    for key in ("first_token_ms", "first_phrase_ms", "answer_ms"):
        values = [r[key] for r in rows]
        out[f"{key}_p50"] = round(float(np.percentile(values, 50)), 1)
        out[f"{key}_p90"] = round(float(np.percentile(values, 90)), 1)
        out[f"{key}_worst"] = round(max(values), 1)
    out["tokens_per_s"] = round(sum(r["tokens"] for r in rows) / sum(walls), 1)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run the rounds, print and write the figures."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks model_answers")
    parser.add_argument("--counts", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stagger", type=float, default=0.15)
    parser.add_argument("--out", type=Path, default=RESULTS / "model_answers_bench.json")
    args = parser.parse_args(argv)
    model = talk_model("llm_embedded").EmbeddedChatModel(threads=1)
    model.warm_up()
    per_count: dict[str, Any] = {}
    try:
        for count in args.counts:
            rows: list[dict[str, float]] = []
            walls = []
            for r in range(args.rounds):
                got, wall = asyncio.run(round_of(model, count, args.stagger, offset=r))
                rows += got
                walls.append(wall)
            per_count[str(count)] = summary(rows, walls)
            s = per_count[str(count)]
            print(f"N={count}: first token p50 {s['first_token_ms_p50']} ms, first phrase p50 "
                  f"{s['first_phrase_ms_p50']} p90 {s['first_phrase_ms_p90']} worst "
                  f"{s['first_phrase_ms_worst']} ms, answer p50 {s['answer_ms_p50']} ms, "
                  f"{s['tokens_per_s']} tokens/s", flush=True)
    finally:
        asyncio.run(model.aclose())
    result = {"tree": str(Path(lipstream.__file__).resolve().parent.parent), "cpu_model": cpu_model(),
              "rounds": args.rounds, "stagger_s": args.stagger, "max_tokens": MAX_TOKENS,
              "first_phrase_tokens": FIRST_PHRASE_TOKENS, "counts": per_count}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    plot(per_count, args.out.with_suffix(".png"))
    print(f"wrote {args.out}")
    return 0


def plot(per_count: dict[str, Any], path: Path) -> None:
    """First phrase p50 / p90 / worst per N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    counts = [int(c) for c in per_count]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for key, style in (("p50", "o-"), ("p90", "s--"), ("worst", "x:")):
        ax.plot(counts, [per_count[str(c)][f"first_phrase_ms_{key}"] for c in counts], style, label=key)
    ax.set(xlabel="answers asked at once", ylabel="question -> first phrase (ms)", xticks=counts)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())

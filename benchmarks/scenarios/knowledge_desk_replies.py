"""The knowledge desk's replies word for word, two runs side by side, as Markdown (issue 47's closing notes).

    .venv/bin/python -m benchmarks knowledge_desk_replies BEFORE.json AFTER.json --labels A B \
        [--out docs/knowledge_desk_replies.md]

BEFORE and AFTER are `python -m benchmarks knowledge_desk` raw results (benchmarks/results/
knowledge_desk_bench.json).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ROWS = (
    ("answerable questions answered right", lambda s: f"{s['answerable_right']} of {s['answerable']} "
     f"({s['answerable_right_pct']} %): direct {s['right_by_kind']['direct']}, paraphrased "
     f"{s['right_by_kind']['paraphrase']}", ">= 85 %"),
    ("answerable questions declined", lambda s: str(s["answerable_declined"]), ""),
    ("unanswerable questions declined", lambda s: f"{s['unanswered_declined']} of {s['unanswered']}",
     ">= 90 %"),
    ("replies with an invented number or name", lambda s: str(s["invented_replies"]), "0"),
    ("replies citing the wrong document", lambda s: str(s["wrong_source"]), ""),
    ("WER of what the server heard", lambda s: str(s["wer"]), ""),
)  # fmt: skip


def _latency(run: dict[str, Any]) -> str:
    first = run["latency_ms"]["speech_end_to_first_frame_ms"]
    return f"{first['p50']:.0f} / {first['p90']:.0f} ms"


def _decision(run: dict[str, Any]) -> str:
    return f"{run['stages_since_speech_end_ms']['decision']['p50']:.0f} ms"


def _reply(q: dict[str, Any]) -> str:
    sources = f" sources {', '.join(q['sources'])}" if q.get("sources") else ""
    return f"{q['reply'] or '(nothing)'} **[{q['verdict']}]**{sources}".replace("|", "/")


def render(before: dict[str, Any], after: dict[str, Any], labels: tuple[str, str]) -> str:
    """The Markdown page: the summary table, then one row a question."""
    a, b = labels
    lines = [
        "# The knowledge desk's replies, word for word (issue 47)",
        "",
        "The 36 spoken questions of `python -m benchmarks knowledge_desk` "
        "(benchmarks/knowledge_desk_corpus.py), what Whisper tiny.en heard, and what "
        "`serve --agent --knowledge --persona` said, in two runs: "
        f"{a} and {b} ({before['cpu']} / {after['cpu']}, {after['cores']} cores). Written by "
        "`python -m benchmarks knowledge_desk_replies` from the two runs' raw JSON.",
        "",
        f"| | {a} | {b} | goal |",
        "|---|---|---|---|",
    ]
    for name, cell, goal in ROWS:
        lines.append(f"| {name} | {cell(before['summary'])} | {cell(after['summary'])} | {goal} |")
    first = "end of speech -> first answer frame p50 / p90"
    decided = "turn decided after the end of speech p50"
    lines.append(f"| {first} | {_latency(before)} | {_latency(after)} | <= 800 / 1100 ms |")
    lines.append(f"| {decided} | {_decision(before)} | {_decision(after)} | <= 350 ms |")
    lines += ["", f"| # | question (voice) | heard {a} / {b} | reply {a} | reply {b} |"]
    lines.append("|---|---|---|---|---|")
    for index, (x, y) in enumerate(zip(before["questions"], after["questions"], strict=True), 1):
        heard = f"{x['heard']} / {y['heard']}".replace("|", "/")
        lines.append(f"| {index} | {y['question']} ({y['voice']}) | {heard} | {_reply(x)} | {_reply(y)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--labels", nargs=2, default=("before", "after"))
    parser.add_argument("--out", type=Path, default=Path("docs/knowledge_desk_replies.md"))
    args = parser.parse_args(argv)
    runs = [json.loads(p.read_text()) for p in (args.before, args.after)]
    args.out.write_text(render(runs[0], runs[1], tuple(args.labels)))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

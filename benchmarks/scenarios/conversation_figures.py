"""The conversation benchmark's figures: a question's stages, percentiles, the modes' summaries, the plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.scenarios.conversation_questions import STAGES, wer

try:
    from lipstream.server.converse_client import ConverseReport
except ImportError:  # a tree from before the rename (before/after runs with this script)
    from lipstream.server.converse import ConverseReport  # type: ignore[no-redef]


def summarise(question: dict[str, Any], report: ConverseReport) -> dict[str, Any]:
    """The per-question row of the JSON."""
    ms = (report.turn_metrics or {}).get("ms") or {}
    delivery = None
    if report.server_speech_end_to_first_frame_ms is not None and ms.get("first_frame") is not None:
        delivery = round(report.server_speech_end_to_first_frame_ms - ms["first_frame"], 1)
    return {
        "text": question["text"],
        "voice": question["voice"],
        "final_transcript": report.final_transcript,
        "partials": sum(1 for t in report.transcripts if t.get("kind") == "partial"),
        "reply": report.reply,
        "speech_end_to_first_frame_ms": report.speech_end_to_first_frame_ms,
        "speech_end_to_first_frame_shown_ms": report.speech_end_to_first_frame_due_ms,
        "server_speech_end_to_first_frame_ms": report.server_speech_end_to_first_frame_ms,
        "end_of_turn_to_first_frame_ms": report.end_of_turn_to_first_frame_ms,
        "speech_end_to_end_of_turn_ms": _minus(
            report.speech_end_to_first_frame_ms, report.end_of_turn_to_first_frame_ms
        ),
        "vad_end_offset_ms": None
        if report.server_speech_end_samples is None
        else round((report.server_speech_end_samples - report.speech_end_samples) / 16, 1),
        "turn_metrics_ms": ms or None,
        "delivery_ms": delivery,  # server's first_frame stage -> the frame at the client
        "player_stall_ms": report.player_stall_ms,
        "end_rule": report.end_rule,
        "end_score": report.end_score,
        "turn_decisions": [(d.get("finished"), d.get("score")) for d in report.turn_decisions],
        "early_turn_ends": report.early_turn_ends,
        "answered_early": report.answered_early,
        "speculation": (report.turn_metrics or {}).get("speculation"),
        "errors": [e.get("code") for e in report.errors],
    }


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 1)


def percentiles(values: list[float | None]) -> dict[str, Any]:
    """p50/p90/p95, the worst (and n) of the values that exist."""
    have = [v for v in values if v is not None]
    if not have:
        return {"p50": None, "p90": None, "p95": None, "worst": None, "n": 0}
    return {
        "p50": round(float(np.percentile(have, 50)), 1),
        "p90": round(float(np.percentile(have, 90)), 1),
        "p95": round(float(np.percentile(have, 95)), 1),
        "worst": round(float(max(have)), 1),
        "n": len(have),
    }


def aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """p50/p95 of each latency and stage, and the WER per voice."""
    ok = [r for r in rows if "error" not in r]
    latency = {
        key: percentiles([r[key] for r in ok])
        for key in ("speech_end_to_first_frame_ms", "speech_end_to_first_frame_shown_ms",
                    "end_of_turn_to_first_frame_ms", "speech_end_to_end_of_turn_ms",
                    "server_speech_end_to_first_frame_ms", "delivery_ms", "vad_end_offset_ms")
    }  # fmt: skip
    stages = {s: percentiles([(r["turn_metrics_ms"] or {}).get(s) for r in ok]) for s in STAGES}
    by_voice = {
        voice: wer([(r["text"], r["final_transcript"] or "") for r in ok if r["voice"] == voice])
        for voice in sorted({r["voice"] for r in ok})
    }
    by_voice["all"] = wer([(r["text"], r["final_transcript"] or "") for r in ok])
    used = [((r.get("speculation") or {}).get("used")) for r in ok]
    return {
        "answered": len(ok),
        "failed": [r for r in rows if "error" in r],
        "latency_ms": latency,
        "stages_since_speech_end_ms": stages,
        "wer": by_voice,
        # where the spoken answer was started: at the pause that ended the turn, at an earlier one the user
        # spoke past without changing the words, or only after the end (None: a server without the figure)
        "speculation_used": {str(u): used.count(u) for u in sorted(set(used), key=str)},
    }


# ----- one mode -------------------------------------------------------------------------------------------


def count_rules(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many turns each rule ended."""
    rules = [str(r.get("end_rule")) for r in rows]
    return {rule: rules.count(rule) for rule in sorted(set(rules))}


def paused_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """How the turn rule did on questions paused mid-clause: answered early, turns ended early, whole."""
    ok = [r for r in rows if "error" not in r]
    early = [r for r in ok if r["answered_early"]]
    cut = [r for r in ok if r["early_turn_ends"]]
    return {
        "questions": len(ok),
        "answered_early": len(early),
        "answered_early_rate": round(len(early) / len(ok), 3) if ok else None,
        "turn_ended_early": len(cut),
        "final_transcript_whole_wer": wer([(r["text"], r["final_transcript"] or "") for r in ok]),
        "end_rules": count_rules(ok),
        "speech_end_to_first_frame_ms": percentiles(
            [r["speech_end_to_first_frame_ms"] for r in ok if not r["answered_early"]]
        ),
        "failed": [r for r in rows if "error" in r],
    }


# ----- output ---------------------------------------------------------------------------------------------


STAGE_LABELS = {
    "transcript": ("final transcript", "#4c78a8"), "decision": ("end of turn decided", "#9b6bd6"),
    "llm_first_token": ("LLM first token", "#f58518"), "first_phrase": ("first phrase written", "#d9773b"),
    "first_audio": ("first TTS audio", "#54a24b"), "first_frame": ("first frame sent", "#e05a5a"),
}


def _waterfall_row(ax, y: float, ms: dict[str, float | None], label: bool) -> float:  # noqa: ANN001
    """One turn's stages as bars, each from the previous stage to its own; returns where it ends."""
    prev = 0.0
    for stage in STAGES:
        mark = ms.get(stage)
        if mark is None:
            continue
        name, colour = STAGE_LABELS[stage]
        start = min(prev, mark)
        ax.barh(y, max(4.0, mark - start), left=start, height=0.7, color=colour,
                label=name if label else None)  # fmt: skip
        prev = max(prev, mark)
    return prev


def plot(results: dict[str, Any], path: Path) -> None:
    """The waterfall of every question's turn, one panel per mode, the p50 row on top: where the time
    from the end of the user's speech to the first answer frame goes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(results["modes"])
    rows = max(len(results["modes"][m]["questions"]) for m in modes) + 1
    fig, axes = plt.subplots(len(modes), 1, figsize=(9, 0.9 + 0.22 * rows * len(modes)), squeeze=False)
    right = 0.0
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        res = results["modes"][mode]
        p50 = {s: res["stages_since_speech_end_ms"][s]["p50"] for s in STAGES}
        right = max(right, _waterfall_row(ax, 0, p50, label=ax is axes[0, 0]))
        labels = ["p50"]
        for i, row in enumerate(res["questions"], start=1):
            right = max(right, _waterfall_row(ax, i, row.get("turn_metrics_ms") or {}, label=False))
            labels.append(f"{row['text'][:28]}… ({row['voice']})")
        ax.set_yticks(range(len(labels)), labels, fontsize=6)
        ax.invert_yaxis()
        frame = res["latency_ms"]["speech_end_to_first_frame_ms"]
        ax.set_title(f"{mode}: end of speech -> first frame at the client p50 {frame['p50']} ms, p90 "
                     f"{frame['p90']} ms", fontsize=8)  # fmt: skip
        ax.axvline(800, color="k", lw=0.6, ls="--")
    for ax in axes[:, 0]:
        ax.set_xlim(0, max(1000.0, right * 1.05))
    axes[-1, 0].set_xlabel("ms since the end of the user's speech (server marks; dashed: the 800 ms goal)")
    fig.suptitle(f"Where a turn's time goes — {results['cpu']}, {results['cores']} cores", fontsize=9)
    fig.legend(fontsize=7, loc="lower center", ncol=6)
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    fig.savefig(path, dpi=120)
    plt.close(fig)

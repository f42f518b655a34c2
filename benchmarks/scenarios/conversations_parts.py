"""The `conversations` scenario's parts: the visitors (a voice and questions each, every question with its own
answer keywords), whether a turn crossed into another visitor's, the CPU of the server's processes, the
figures of one round and the plot."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.scenarios.conversation_figures import _waterfall_row, percentiles
from benchmarks.scenarios.conversation_questions import STAGES, _write_wav, espeak_wav
from lipstream.talk.hearing.stt import word_edits

# Six visitors' questions, four each: (question, the words a reply to it mentions: its topic and the words of
# its answer). Every keyword belongs to one question only, and a visitor's questions share a theme, so that a
# reply naming another visitor's keyword was crossed (it drew on that visitor's turn), not merely related
# (tea and honey are one visitor's).
VISITOR_QUESTIONS: tuple[tuple[tuple[str, tuple[str, ...]], ...], ...] = (
    (
        ("How do I make a cup of green tea?", ("tea", "teapot", "teabag")),
        ("How do bees make honey?", ("bee", "honey", "nectar", "hive")),
        ("How much coffee is too much in one day?", ("coffee", "caffeine", "espresso")),
        ("Is dark chocolate good for you?", ("chocolate", "cocoa", "cacao")),
    ),
    (
        ("Tell me something interesting about the moon.", ("moon", "lunar")),
        ("How does a rainbow form after the rain?", ("rainbow", "prism", "refraction")),
        ("How do airplanes stay up in the air?", ("airplane", "aeroplane", "plane", "aircraft")),
        ("How does a camera take a photo?", ("camera", "photo", "photograph", "lens", "shutter")),
    ),
    (
        ("Where do penguins live?", ("penguin", "antarctica", "antarctic")),
        ("How heavy is an adult elephant?", ("elephant",)),
        ("Why do cats purr?", ("cat", "purr", "purring", "kitten", "feline")),
        ("Are spiders insects?", ("spider", "arachnid")),
    ),
    (
        ("How do dolphins sleep?", ("dolphin",)),
        ("Why do volcanoes erupt?", ("volcano", "lava", "magma", "eruption", "erupt")),
        ("What makes a diamond so hard?", ("diamond",)),
        ("How does a compass point north?", ("compass", "magnet", "magnetic")),
    ),
    (
        ("How can I learn to play the guitar?", ("guitar", "chord")),
        ("How long does it take to learn the piano?", ("piano", "pianist")),
        ("What are the basic rules of football?", ("football", "soccer")),
        ("How do I fix a flat tyre on my bicycle?", ("bicycle", "bike", "tyre", "tire", "puncture")),
    ),
    (
        ("What should I do if I forget my umbrella?", ("umbrella", "raincoat")),
        ("How do I grow tomatoes in my garden?", ("tomato",)),
        ("What is the best way to cook rice?", ("rice",)),
        ("Who built the pyramids in Egypt?", ("pyramid", "egypt", "egyptian", "pharaoh")),
    ),
)
MAX_VISITORS = len(VISITOR_QUESTIONS)
MAX_QUESTIONS = min(len(q) for q in VISITOR_QUESTIONS)
# one voice a visitor: lipstream's Piper and espeak-ng voices, and espeak-ng variants no test uses (other
# accents and speeds, conversation_questions.HELDOUT_VOICES), alternately
VISITOR_VOICES: tuple[tuple[str, int | None], ...] = (
    ("piper", None), ("en-gb+Andy", 165), ("espeak", None), ("en-us+Annie", 150), ("en-029+m3", 160),
    ("en-gb-scotland+f2", 155),
)  # fmt: skip
WARM_UP = "Can you hear me clearly?"  # no pause inside: one turn
CLIENTS = "clients (this process)"  # the visitors' own CPU, beside the server's processes
STALL_MS = 100  # a wait of the player's clock longer than this is heard as a gap


# ----- the visitors ---------------------------------------------------------------------------------------


def _speech(voice: str, speed: int | None, text: str, lipstream_voices: dict[str, Any]) -> np.ndarray:
    if speed is None:  # lipstream's own voice
        if voice not in lipstream_voices:
            from lipstream.talk.voices.tts import create_tts

            lipstream_voices[voice] = create_tts(voice, **({"fallback": False} if voice == "piper" else {}))
        return lipstream_voices[voice].synthesize(text).pcm
    return espeak_wav(text, voice, speed)


def make_visitors(folder: Path, count: int, per_visitor: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """`count` visitors, each with its voice and `per_visitor` questions as WAVs (half a second of silence
    before, 0.2 s after, as the conversation scenario's); and the warm-up question, in the first voice."""
    voices: dict[str, Any] = {}
    visitors = []
    for i in range(count):
        voice, speed = VISITOR_VOICES[i]
        questions = []
        for j, (text, keywords) in enumerate(VISITOR_QUESTIONS[i][:per_visitor]):
            path = folder / f"v{i}q{j}.wav"
            seconds = _save(path, _speech(voice, speed, text, voices))
            questions.append({"text": text, "keywords": keywords, "voice": voice, "path": path,
                              "seconds": seconds})  # fmt: skip
        visitors.append({"visitor": i, "voice": voice, "questions": questions})
    path = folder / "warm_up.wav"
    seconds = _save(path, _speech(*VISITOR_VOICES[0], WARM_UP, voices))
    return visitors, {"text": WARM_UP, "keywords": (), "voice": VISITOR_VOICES[0][0], "path": path,
                      "seconds": seconds}  # fmt: skip


def _save(path: Path, speech: np.ndarray) -> float:
    pcm = np.concatenate([np.zeros(8000, np.float32), speech, np.zeros(3200, np.float32)])
    _write_wav(path, pcm)
    return round(len(pcm) / 16000, 2)


# ----- crossed turns --------------------------------------------------------------------------------------


def mentions(text: str, keywords: tuple[str, ...]) -> list[str]:
    """The keywords `text` names as whole words (case ignored; a plural in -s or -es counts)."""
    return [k for k in keywords if re.search(rf"\b{re.escape(k)}(?:s|es)?\b", text, re.IGNORECASE)]


def _distance(reference: str, transcript: str) -> float:
    edits, words = word_edits(reference, transcript)
    return edits / max(words, 1)


RESEMBLES = 0.5  # word edits over the question's words below which a transcript is that question, misheard


def judge_turn(row: dict[str, Any], own: dict[str, Any], others: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether a turn stayed its own: the final transcript nearest (word edits over the question's words) its
    own question rather than another visitor's of this round, and the reply naming its own question's
    keywords and none of the others'. `crossed`: the transcript nearer another visitor's question (and
    resembling it), or the reply naming another's keyword; `answered_own`: neither, the transcript nearest
    its own, and the reply naming one of its own keywords."""
    transcript, reply = row.get("final_transcript") or "", row.get("reply") or ""
    own_distance = _distance(own["text"], transcript) if transcript else None
    # a transcript far from every question (misheard: "Why do volcanoes erupt?" heard as "Why do I can only
    # love?") may land nearer another one by chance: only one that resembles it (half its words or more
    # right) is that visitor's question
    nearer = [
        o["text"] for o in others
        if transcript and _distance(o["text"], transcript) < min(own_distance, RESEMBLES)
    ]  # fmt: skip
    tied = [o["text"] for o in others if transcript and _distance(o["text"], transcript) == own_distance]
    foreign = {o["text"]: found for o in others if (found := mentions(reply, tuple(o["keywords"])))}
    own_words = mentions(reply, tuple(own["keywords"]))
    heard_own = bool(transcript) and not nearer and not tied
    crossed = bool(nearer) or bool(foreign)
    return {
        "transcript_distance_own": None if own_distance is None else round(own_distance, 3),
        "transcript_nearer_another": nearer,
        "transcript_own": heard_own,
        "reply_own_keywords": own_words,
        "reply_other_keywords": foreign,
        "crossed": crossed,
        "answered_own": heard_own and not crossed and bool(own_words),
    }


# ----- CPU of the server's processes ----------------------------------------------------------------------

ROLES = {"lipstream.talk.models.llm_child": "model", "lipstream.talk.hearing.stt_child": "recogniser"}


def _role(cmdline: list[str]) -> str:
    """What a process of the server is, from its command line: `lipstream serve`, a known child's role, or
    the module or program it runs."""
    if "-m" in cmdline[:-1]:
        module = cmdline[cmdline.index("-m") + 1]
        if module == "lipstream":
            return "server"
        return ROLES.get(module, module.rsplit(".", 1)[-1])
    return Path(cmdline[0]).name if cmdline else "?"


def cpu_snapshot(pid: int) -> dict[int, dict[str, Any]]:
    """The server and every process under it: role and CPU seconds (user + system) so far; the server's
    also counts the subprocesses it has reaped (short-lived helpers)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return {}
    snap = {}
    for proc in procs:
        try:
            with proc.oneshot():
                times, cmdline = proc.cpu_times(), proc.cmdline()
        except psutil.Error:
            continue
        reaped = times.children_user + times.children_system if proc.pid == pid else 0.0
        snap[proc.pid] = {"role": _role(cmdline), "cpu_s": times.user + times.system, "reaped_s": reaped}
    return snap


def cpu_delta(before: dict[int, dict[str, Any]], after: dict[int, dict[str, Any]]) -> dict[str, float]:
    """CPU seconds each process spent between two snapshots, by role ("role #pid" when a role has several
    processes, e.g. a restarted child); a process started in between counts whole; `server subprocesses`:
    what the server's finished subprocesses spent."""
    roles = [p["role"] for p in after.values()]
    spent: dict[str, float] = {}
    for pid, proc in after.items():
        name = proc["role"] if roles.count(proc["role"]) == 1 else f"{proc['role']} #{pid}"
        was = before.get(pid, {"cpu_s": 0.0, "reaped_s": 0.0})
        spent[name] = round(proc["cpu_s"] - was["cpu_s"], 2)
        if proc["reaped_s"] - was["reaped_s"] > 0:
            spent["server subprocesses"] = round(proc["reaped_s"] - was["reaped_s"], 2)
    gone = [p["role"] for pid, p in before.items() if pid not in after]
    if gone:
        spent["ended during the round (not counted)"] = float(len(gone))
    return spent


# ----- one round's figures --------------------------------------------------------------------------------


def summarise_round(
    n: int, rows: list[dict[str, Any]], cpu: dict[str, float], wall_s: float
) -> dict[str, Any]:
    """One round's figures: first-frame latency, the stages' p50 and p90, CPU and cores by process, crossed
    and answered turns."""
    ok = [r for r in rows if "error" not in r]
    stages = {}
    for stage in STAGES:
        marks = percentiles([(r.get("turn_metrics_ms") or {}).get(stage) for r in ok])
        stages[stage] = {"p50": marks["p50"], "p90": marks["p90"], "n": marks["n"]}
    server_total = sum(v for k, v in cpu.items() if k != CLIENTS and "ended" not in k)
    return {
        "visitors": n,
        "turns": len(rows),
        "failed": [
            {"visitor": r["visitor"], "text": r["text"], "error": r["error"]} for r in rows if "error" in r
        ],
        "no_first_frame": sum(1 for r in ok if r.get("speech_end_to_first_frame_ms") is None),
        "speech_end_to_first_frame_ms": percentiles([r.get("speech_end_to_first_frame_ms") for r in ok]),
        "speech_end_to_first_frame_shown_ms": percentiles(
            [r.get("speech_end_to_first_frame_shown_ms") for r in ok]
        ),
        "stages_since_speech_end_ms": stages,
        # turns of visitors in line for a seat: when they saw and heard the wait, how long their answer waited
        "waiting": {
            "turns": sum(1 for r in ok if r.get("waited")),
            "seen_ms": percentiles([r.get("wait_seen_ms") for r in ok if r.get("waited")]),
            "heard_ms": percentiles([r.get("wait_heard_ms") for r in ok if r.get("waited")]),
            "waited_ms": percentiles([r.get("waited_ms") for r in ok if r.get("waited")]),
        },
        "speech_end_to_first_frame_seated_ms": percentiles(
            [r.get("speech_end_to_first_frame_ms") for r in ok if not r.get("waited")]
        ),
        "wall_s": round(wall_s, 1),
        "cpu_seconds": cpu,
        "cores": {k: round(v / wall_s, 3) for k, v in cpu.items() if "ended" not in k},
        "server_and_its_processes_cores": round(server_total / wall_s, 3),
        # the answer ran dry while it played (a later sentence written or spoken late)
        "player_stall_ms": percentiles([r.get("player_stall_ms") for r in ok]),
        "turns_stalled": sum(1 for r in ok if (r.get("player_stall_ms") or 0) > STALL_MS),
        "crossed": sum(1 for r in rows if r.get("crossed")),
        "answered_own": sum(1 for r in rows if r.get("answered_own")),
        "transcript_own": sum(1 for r in rows if r.get("transcript_own")),
    }


# ----- the plot -------------------------------------------------------------------------------------------


def plot(rounds: list[dict[str, Any]], rows: dict[int, list[dict[str, Any]]], title: str, path: Path) -> None:
    """Three panels: end of speech -> first frame per N (every turn, p50, p90, worst), the stages' p50 per N
    as a waterfall, and each process's cores per N."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["visitors"] for r in rounds]
    fig, (lat, fall, cpu) = plt.subplots(1, 3, figsize=(15, 5.2))
    for n in ns:
        for waited, color in ((False, "0.6"), (True, "tab:red")):  # red: the answer waited for a seat
            dots = [r["speech_end_to_first_frame_ms"] for r in rows[n]
                    if r.get("speech_end_to_first_frame_ms") and bool(r.get("waited")) == waited]  # fmt: skip
            lat.scatter([n] * len(dots), dots, s=10, color=color, alpha=0.7, zorder=1)
    for key, style in (("p50", "o-"), ("p90", "s--"), ("worst", "^:")):
        lat.plot(ns, [r["speech_end_to_first_frame_ms"][key] for r in rounds], style, label=key, zorder=2)
    lat.set_xticks(ns)
    lat.set_xlabel("conversations at once (N)")
    lat.set_ylabel("ms, end of speech -> first answer frame at the client")
    lat.set_ylim(bottom=0)
    lat.legend(fontsize=8)
    lat.grid(alpha=0.3)
    lat.set_title("first answer frame (dots: every turn; red: it waited for a seat)", fontsize=9)
    right = 0.0
    for i, r in enumerate(rounds):
        p50 = {s: r["stages_since_speech_end_ms"][s]["p50"] for s in STAGES}
        right = max(right, _waterfall_row(fall, i, p50, label=i == 0))
        frame = r["speech_end_to_first_frame_ms"]["p50"]
        if frame is not None:
            fall.plot([frame], [i], "k|", ms=14)
    fall.set_yticks(range(len(ns)), [f"N={n}" for n in ns])
    fall.invert_yaxis()
    fall.set_xlim(0, max(1000.0, right * 1.1))
    fall.set_xlabel("ms since the end of speech, p50 of each stage (|: first frame at the client, p50)")
    fall.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
    fall.set_title("where the time goes (server's turn_metrics)", fontsize=9)
    # the server's processes stacked, the clients (this process, not the server's) last and hatched
    names = sorted({k for r in rounds for k in r["cores"]}, key=lambda k: (k == CLIENTS, k != "server", k))
    bottom = np.zeros(len(ns))
    for name in names:
        values = np.array([r["cores"].get(name, 0.0) for r in rounds])
        style = {"color": "0.85", "hatch": "//", "edgecolor": "0.5"} if name == CLIENTS else {}
        cpu.bar([str(n) for n in ns], values, bottom=bottom, label=name, **style)
        bottom += values
    cpu.set_xlabel("conversations at once (N)")
    cpu.set_ylabel("cores (CPU seconds / wall seconds of the round)")
    cpu.legend(fontsize=7)
    cpu.set_title("CPU by process", fontsize=9)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)

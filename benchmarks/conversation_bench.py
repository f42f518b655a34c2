"""The conversation loop's figures (issue 9): scripted spoken questions streamed in real time to a real
`lipstream serve --agent` process; latency from the end of the user's speech to the avatar's first answer
frame at the client, by stage, with the embedded model and with an instant-first-token OpenAI endpoint;
the STT word error rate; the server's memory idle, with one conversation and with two at once.

    .venv/bin/python benchmarks/conversation_bench.py [--avatars-dir out/home/avatars] [--avatar sample]
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
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import wave
from pathlib import Path
from typing import Any

import numpy as np
from bench_common import child_pids, cpu_model, open_or_build_avatar, rss_mib, start_server

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from paused_speech import PAUSED_QUESTIONS, paused_question  # noqa: E402

import lipstream
from lipstream.server.client import ClientError
from lipstream.talk.hearing.stt import word_edits

try:
    from lipstream.server.converse_client import ConverseReport, run_converse
except ImportError:  # a tree from before the rename (before/after runs with this script)
    from lipstream.server.converse import ConverseReport, run_converse  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parent.parent
# the lipstream this process imports: its server is the one measured (PYTHONPATH picks the tree, so
# before_after.py --script-from-after measures an older tree with this script and its questions)
TREE = Path(lipstream.__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
FAKE_REPLY = "Here is a short answer for you. I hope that it helps."
# keeps each answer a few seconds long, so the bench takes minutes (the first frame's latency is unaffected)
MAX_REPLY_TOKENS = 32
QUESTIONS = (
    "What is the weather like in the city today?",
    "Can you recommend a good book for a long train journey?",
    "How do I make a cup of green tea?",
    "What time does the library close on Saturday?",
    "Tell me something interesting about the moon.",
    "Which is the fastest way to get to the airport?",
    "Could you explain how a rainbow forms?",
    "What should I cook for dinner tonight?",
    "How far is the nearest train station from here?",
    "Why is the sky blue during the day?",
    "Do you know a quick exercise to relax my shoulders?",
    "What is the capital city of Australia?",
)
# turn_metrics' stages, since the end of speech (an older server reports the first four only)
STAGES = ("transcript", "decision", "llm_first_token", "first_phrase", "first_audio", "first_frame")
# held out: questions and voices no test uses (espeak-ng voice variants, other accents and speeds)
HELDOUT_QUESTIONS = (
    "What time does the library open on Saturday morning?",
    "How far away is the moon from the earth?",
    "Can you tell me a short joke about cats?",
    "Where can I park my car near the museum?",
    "How long should I boil an egg?",
    "What is a good name for a small black dog?",
    "Is it going to snow in the mountains this week?",
    "Which planet is the largest in our solar system?",
    "How do I say thank you in Spanish?",
    "What can I do on a rainy afternoon with children?",
    "Why do leaves change colour in autumn?",
    "How many hours of sleep does an adult need?",
)
HELDOUT_VOICES = (("en-gb+Andy", 165), ("en-us+Annie", 150), ("en-029+m3", 160), ("en-gb-scotland+f2", 155))
BARGE_IN_NOTE = (
    "user speech onset -> last avatar speech frame shown, measured in headless Chromium by the browser Talk "
    "test (tests/test_browser_talk.py), not by this script: null here"
)


# ----- word error rate ------------------------------------------------------------------------------------


def wer(pairs: list[tuple[str, str]]) -> float | None:
    """Corpus word error rate of (reference, hypothesis) pairs: all edits over all reference words."""
    counts = [word_edits(r, h) for r, h in pairs]
    words = sum(n for _, n in counts)
    return None if words == 0 else round(sum(e for e, _ in counts) / words, 4)


# ----- processes ------------------------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_fake_llm() -> tuple[subprocess.Popen, str]:
    """tests/fake_llm_server.py (first token at once) as a process; its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "tests" / "fake_llm_server.py"), "--port", str(port),
         "--text", FAKE_REPLY],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}"
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the fake LLM server did not start")


def start_local_llm() -> tuple[subprocess.Popen, str, str]:
    """The embedded SmolLM2 behind its OpenAI-compatible endpoint (lipstream.talk.models.llm_child) as a
    server of
    its own, as a user's local llama.cpp server would be: the process, its URL and its key."""
    import secrets

    from lipstream.talk.models.llm_llama import bundled_gguf_path

    key = secrets.token_hex(16)
    cmd = [sys.executable, "-m", "lipstream.talk.models.llm_child", "--model", str(bundled_gguf_path()),
           "--parent-pid", str(os.getpid()), "--threads", "1", "--name", "local-smollm2"]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=TREE, env={**os.environ, "LIPSTREAM_MODEL_KEY": key},
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)  # fmt: skip
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith("{") and '"ready"' in line:
            return proc, f"http://127.0.0.1:{json.loads(line)['port']}/v1", key
    proc.kill()
    raise RuntimeError("the local SmolLM2 server did not start")


def start_agent_server(
    avatars_dir: Path, extra: list[str], env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str, float]:
    """`lipstream serve --agent ...` on a free port; the process, its ws URL and seconds until it listened."""
    args = ["--avatars-dir", str(avatars_dir), "--agent", "--max-reply-tokens", str(MAX_REPLY_TOKENS), *extra]
    proc, http, seconds = start_server(args, cwd=TREE, env=env)
    return proc, http.replace("http://", "ws://", 1) + "/ws", seconds


def stop(proc: subprocess.Popen) -> None:
    """Terminate one process we started, and reap it."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class RssSampler:
    """Samples a process's resident memory every 50 ms; `peak()` since the last `reset()`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _field(self, name: str) -> int:
        status = Path(f"/proc/{self.pid}/status").read_text()
        return int(re.search(rf"{name}:\s+(\d+)", status).group(1))

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            try:
                self._peak = max(self._peak, self._field("VmRSS"))
            except (OSError, AttributeError):
                return

    def reset(self) -> None:
        """Start a new phase."""
        self._peak = self._field("VmRSS")

    def peak_mib(self) -> float:
        """The highest VmRSS seen in this phase, MiB."""
        return round(max(self._peak, self._field("VmRSS")) / 1024, 1)

    def hwm_mib(self) -> float:
        """The kernel's high-water mark of the process's RSS (VmHWM), MiB."""
        return round(self._field("VmHWM") / 1024, 1)

    def close(self) -> None:
        """Stop sampling."""
        self._stop.set()


# ----- questions ------------------------------------------------------------------------------------------


def _write_wav(path: Path, pcm: np.ndarray) -> None:
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(np.clip(pcm * 32767, -32768, 32767).astype("<i2").tobytes())


def make_paused_questions(folder: Path, count: int) -> list[dict[str, Any]]:
    """WAVs of questions with a 0.5-0.8 s pause after an unfinished clause (tests/paused_speech.py), Piper
    and espeak-ng alternately: answering before the second part is an early answer."""
    from lipstream.talk.voices.tts import create_tts

    voices = {"piper": create_tts("piper", fallback=False), "espeak": create_tts("espeak")}
    made = []
    for i in range(count):
        before, after = PAUSED_QUESTIONS[i % len(PAUSED_QUESTIONS)]
        voice = "piper" if i % 2 == 0 else "espeak"
        pause = (0.5, 0.6, 0.7, 0.8)[i % 4]
        question = paused_question(voices[voice], before, after, pause)
        pcm = np.concatenate([np.zeros(8000, np.float32), question.pcm, np.zeros(3200, np.float32)])
        path = folder / f"p{i:02d}_{voice}.wav"
        _write_wav(path, pcm)
        made.append({"text": question.text, "voice": voice, "path": path, "pause_s": pause,
                     "seconds": round(len(pcm) / 16000, 2)})  # fmt: skip
    return made


def espeak_wav(text: str, voice: str, speed: int) -> np.ndarray:
    """`espeak-ng -v VOICE -s SPEED` speech as 16 kHz float PCM (the CLI, not lipstream's voice)."""
    from scipy.signal import resample_poly

    raw = subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "--stdout", text],
                         capture_output=True, check=True).stdout  # fmt: skip
    with wave.open(__import__("io").BytesIO(raw)) as wav:
        rate = wav.getframerate()
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), "<i2").astype(np.float32) / 32768.0
    return resample_poly(pcm, 16000, rate).astype(np.float32)


def make_heldout_questions(folder: Path, count: int) -> list[dict[str, Any]]:
    """WAVs of held-out questions in held-out voices (espeak-ng variants no test uses), silence around."""
    made = []
    for i in range(count):
        text = HELDOUT_QUESTIONS[i % len(HELDOUT_QUESTIONS)]
        voice, speed = HELDOUT_VOICES[i % len(HELDOUT_VOICES)]
        speech = espeak_wav(text, voice, speed)
        pcm = np.concatenate([np.zeros(8000, np.float32), speech, np.zeros(3200, np.float32)])
        path = folder / f"h{i:02d}.wav"
        _write_wav(path, pcm)
        made.append({"text": text, "voice": voice, "path": path, "seconds": round(len(pcm) / 16000, 2)})
    return made


def make_questions(folder: Path, count: int) -> list[dict[str, Any]]:
    """WAVs of the scripted questions, Piper and espeak-ng alternately, with silence before and after."""
    from lipstream.talk.voices.tts import create_tts

    voices = {"piper": create_tts("piper", fallback=False), "espeak": create_tts("espeak")}
    made = []
    for i in range(count):
        text = QUESTIONS[i % len(QUESTIONS)]
        voice = "piper" if i % 2 == 0 else "espeak"
        speech = voices[voice].synthesize(text).pcm
        pcm = np.concatenate([np.zeros(8000, np.float32), speech, np.zeros(3200, np.float32)])
        path = folder / f"q{i:02d}_{voice}.wav"
        _write_wav(path, pcm)
        made.append({"text": text, "voice": voice, "path": path, "seconds": round(len(pcm) / 16000, 2)})
    return made


async def ask(url: str, avatar: str, question: dict[str, Any], width: int | None) -> dict[str, Any]:
    """One question in a fresh session: the client's report, reduced to what the bench uses."""
    try:
        report = await run_converse(url, avatar, question["path"], output_width=width, timeout=60)
    except ClientError as exc:
        return {"text": question["text"], "voice": question["voice"], "error": str(exc)}
    return summarise(question, report)


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
    """p50/p90/p95 (and n) of the values that exist."""
    have = [v for v in values if v is not None]
    if not have:
        return {"p50": None, "p90": None, "p95": None, "n": 0}
    return {
        "p50": round(float(np.percentile(have, 50)), 1),
        "p90": round(float(np.percentile(have, 90)), 1),
        "p95": round(float(np.percentile(have, 95)), 1),
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
    if not (args.avatars_dir / args.avatar / "manifest.json").is_file():
        os.environ["LIPSTREAM_HOME"] = str(args.avatars_dir.parent)
        open_or_build_avatar(args.avatar)
    manifest = json.loads((args.avatars_dir / args.avatar / "manifest.json").read_text())
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

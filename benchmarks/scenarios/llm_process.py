"""The embedded language model out of process (issue 19): build speed, crash recovery and memory.

    .venv/bin/python -m benchmarks llm_process [--native-python /tmp/native/bin/python]
        [--rounds 5] [--crashes 5] [--avatars-dir DIR --avatar NAME]
        [--out benchmarks/results/llm_process_bench.json]

1. **tokens/s**: SmolLM2-135M on llama.cpp, the same prompt and greedy-ish sampling, in alternating rounds:
   the portable build (this venv) in-process, the same through the model process over HTTP (what the
   conversation uses), and, with --native-python, an interpreter whose llama-cpp-python was built with
   llama.cpp's default settings, tuned to this machine's CPU (for comparison only, in a throwaway venv).
2. **crash -> next answer**: SIGSEGV to the model process while it answers, then time until the next
   question's first token (restart backoff + load + warm-up + first token), `--crashes` times.
3. **live**: with --avatars-dir, a real `lipstream serve --agent` and a session streaming speech beside it;
   the model process is killed `--crashes` times; the streaming session's largest gap between frames
   and the time until /healthz shows the model up again; the server's idle memory (server + model
   process).
Every part measures the lipstream this process imports (its tree runs the servers and the in-process
rounds). Two trees side by side, e.g. the idle memory before and after the model left the server's process
(this checkout's script on both, each with its own lipstream):

    .venv/bin/python -m benchmarks before_after --before REV -- llm_process --avatars-dir DIR --live-only

Writes JSON and a PNG (recovery times and frame gaps) next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_common import child_pids, cpu_model, rss_mib, start_server, talk_model

import lipstream

ChatMessage = talk_model("llm").ChatMessage
bundled_gguf_path = talk_model("llm_llama").bundled_gguf_path
REPO = Path(__file__).resolve().parents[2]
TREE = Path(lipstream.__file__).resolve().parent.parent  # the lipstream measured (before_after: either tree)
RESULTS = REPO / "benchmarks" / "results"
PROMPT = "Tell me a long story about a lighthouse keeper and a storm."
MAX_TOKENS = 128
PLAYER_BUFFER_SECONDS = 0.15  # the page's jitter buffer

IN_PROCESS = """
import json, sys, threading, time
try:
    from lipstream.talk.models.llm import ChatMessage
    from lipstream.talk.models.llm_llama import LlamaChat, compiled_features
except ImportError:  # a tree before talk/ had rooms
    from lipstream.talk.llm import ChatMessage
    from lipstream.talk.llm_llama import LlamaChat, compiled_features
chat = LlamaChat(sys.argv[1], threads=1)
chat.warm_up()
messages = [ChatMessage("user", sys.argv[2])]
started = time.perf_counter(); first = None; tokens = 0
for _ in chat.generate(messages, int(sys.argv[3]), threading.Event()):
    tokens += 1
    first = first or time.perf_counter()
end = time.perf_counter()
used = sorted(k for k, v in compiled_features().items() if v)
print(json.dumps({"tokens": tokens, "first_token_ms": (first - started) * 1000,
                  "tokens_per_s": (tokens - 1) / (end - first), "features": used}))
"""


def in_process_round(python: str) -> dict[str, Any]:
    """One generation in a fresh interpreter `python` (its own llama-cpp-python build)."""
    env = {**os.environ, "PYTHONPATH": str(TREE)}
    argv = [python, "-c", textwrap.dedent(IN_PROCESS), str(bundled_gguf_path()), PROMPT, str(MAX_TOKENS)]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        return {"error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


async def through_process_round(model: Any) -> dict[str, Any]:
    """One generation through the model process (HTTP, server-sent events)."""
    started = time.perf_counter()
    first = None
    tokens = 0
    async for _ in model.stream([ChatMessage("user", PROMPT)], MAX_TOKENS):
        tokens += 1
        first = first or time.perf_counter()
    end = time.perf_counter()
    return {"tokens": tokens, "first_token_ms": (first - started) * 1000,
            "tokens_per_s": (tokens - 1) / (end - first)}  # fmt: skip


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and range of tokens/s and first-token ms over rounds."""
    good = [r for r in rows if "error" not in r]
    if not good:
        return {"errors": [r["error"] for r in rows]}
    tps = [r["tokens_per_s"] for r in good]
    return {
        "tokens_per_s_median": round(float(np.median(tps)), 1),
        "tokens_per_s_range": [round(min(tps), 1), round(max(tps), 1)],
        "first_token_ms_median": round(float(np.median([r["first_token_ms"] for r in good])), 1),
        "features": good[0].get("features"),
        "errors": [r["error"] for r in rows if "error" in r],
    }


def measure_speed(args: argparse.Namespace) -> dict[str, Any]:
    """Portable in-process, portable through the model process, native in-process: alternating rounds."""
    EmbeddedChatModel = talk_model("llm_embedded").EmbeddedChatModel

    model = EmbeddedChatModel()
    model.warm_up()
    rows: dict[str, list[dict[str, Any]]] = {"portable_in_process": [], "portable_model_process": []}
    if args.native_python:
        rows["native_in_process"] = []
    for i in range(args.rounds):
        rows["portable_in_process"].append(in_process_round(sys.executable))
        rows["portable_model_process"].append(asyncio.run(through_process_round(model)))
        if args.native_python:
            rows["native_in_process"].append(in_process_round(args.native_python))
        print(f"  speed round {i + 1}/{args.rounds}: " + ", ".join(
            f"{k} {v[-1].get('tokens_per_s', v[-1].get('error'))}" for k, v in rows.items()), flush=True)
    asyncio.run(model.aclose())
    return {name: summary(r) for name, r in rows.items()}


def measure_recovery(args: argparse.Namespace) -> dict[str, Any]:
    """SIGSEGV mid-answer, then the next question's first token: seconds."""
    LLMError = talk_model("llm").LLMError
    EmbeddedChatModel = talk_model("llm_embedded").EmbeddedChatModel

    model = EmbeddedChatModel()
    model.warm_up()

    async def once() -> float:
        try:
            count = 0
            async for _ in model.stream([ChatMessage("user", PROMPT)], MAX_TOKENS):
                count += 1
                if count == 3:
                    os.kill(model.status().pid, signal.SIGSEGV)
        except LLMError:
            pass
        killed = time.perf_counter()
        async for _ in model.stream([ChatMessage("user", "Say hello.")], 8):
            return time.perf_counter() - killed
        return float("nan")

    seconds = [asyncio.run(once()) for _ in range(args.crashes)]
    asyncio.run(model.aclose())
    print(f"  crash -> next first token: {[round(s, 2) for s in seconds]} s", flush=True)
    return {"seconds": [round(s, 3) for s in seconds], "max_seconds": round(max(seconds), 3),
            "median_seconds": round(float(np.median(seconds)), 3)}  # fmt: skip


# ----- live: a real server, a streaming session beside the crashes ----------------------------------------


def start_agent_server(avatars_dir: Path) -> tuple[subprocess.Popen, str]:
    """`lipstream serve --agent` on these avatars, of the lipstream imported (TREE); process, its URL."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(TREE)}
    proc, url, _seconds = start_server(["--avatars-dir", str(avatars_dir.resolve()), "--agent"],
                                       cwd=TREE, env=env)  # fmt: skip
    return proc, url


def idle_memory(avatars_dir: Path) -> dict[str, float]:
    """The agent server's idle memory: its own RSS and its children's (the model process)."""
    proc, _url = start_agent_server(avatars_dir)
    try:
        time.sleep(3.0)
        own = rss_mib(proc.pid)
        kids = sum(rss_mib(c) for c in child_pids(proc.pid))
        return {"server_mib": round(own, 1), "model_process_mib": round(kids, 1),
                "total_mib": round(own + kids, 1)}  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(timeout=20)


async def live_crashes(url: str, avatar: str, crashes: int) -> dict[str, Any]:
    """A session speaking the news while the model process is killed `crashes` times."""
    import httpx
    import websockets

    from lipstream.server.protocol import Kind, decode_media

    arrivals: list[float] = []
    pts_of: list[int] = []
    recover: list[float] = []
    ws = await websockets.connect(url.replace("http", "ws") + "/ws", max_size=None)
    await ws.send(json.dumps({"type": "hello", "version": 1, "avatar": avatar}))
    json.loads(await ws.recv())
    text = "Here is the news at nine. " * 40
    await ws.send(json.dumps({"type": "speak", "text": text[:3900]}))
    stop = asyncio.Event()

    async def receive() -> None:
        t0 = None
        last = 0.0
        while not stop.is_set():
            try:
                data = await asyncio.wait_for(ws.recv(), 0.05)
            except asyncio.TimeoutError:
                data = None
            now = time.monotonic()
            message = decode_media(data) if isinstance(data, bytes) else None
            if message is not None and message.kind == Kind.AUDIO:
                arrivals.append(now)
                pts_of.append(message.pts)
                t0 = t0 or now + PLAYER_BUFFER_SECONDS
            if t0 is not None and now - last > 0.1:  # a player's position reports
                await ws.send(json.dumps({"type": "position", "pts": int(max(0.0, now - t0) * 16000)}))
                last = now

    receiver = asyncio.create_task(receive())
    async with httpx.AsyncClient(timeout=5) as http:
        await asyncio.sleep(4.0)
        windows = []
        for _ in range(crashes):
            model = (await http.get(url + "/healthz")).json()["language_model"]
            os.kill(model["pid"], signal.SIGSEGV)
            killed = time.monotonic()
            while True:
                now_model = (await http.get(url + "/healthz")).json()["language_model"]
                if now_model["state"] == "up" and now_model["pid"] not in (None, model["pid"]):
                    break
                await asyncio.sleep(0.05)
            recover.append(time.monotonic() - killed)
            windows.append((killed, time.monotonic() + 0.5))
            await asyncio.sleep(3.0)
        if crashes == 0:  # the control: as long as a run with 5 crashes, none
            await asyncio.sleep(28.0)
    stop.set()
    await receiver
    await ws.close()
    times = np.array(arrivals)
    gaps = np.diff(times)
    # what a viewer sees: a player that starts 150 ms after the first frame and plays on the audio clock
    # stalls when a frame arrives after its due time (frames come in bursts by design, so the gap between
    # arrivals alone says little)
    due = times[0] + PLAYER_BUFFER_SECONDS + (np.array(pts_of) - pts_of[0]) / 16000
    late = times - due
    in_windows = [(times >= a) & (times <= b) for a, b in windows] or [np.zeros(len(times), bool)]
    during = np.any(in_windows, axis=0)
    return {
        "recovery_seconds": [round(r, 3) for r in recover],
        "frames": len(times),
        "frames_late_for_the_player": int((late > 0).sum()),
        "frames_late_during_restarts": int((late[during] > 0).sum()),
        "worst_stall_ms": round(max(0.0, float(late.max())) * 1000, 1),
        "worst_stall_ms_during_restarts": round(max(0.0, float(late[during].max(initial=0))) * 1000, 1),
        "max_arrival_gap_ms_during_restarts": round(
            max(float(np.diff(times[w]).max(initial=0)) for w in in_windows) * 1000, 1),
        "max_arrival_gap_ms_whole_run": round(float(gaps.max()) * 1000, 1),
        "media_seconds_per_wall_second": round((pts_of[-1] - pts_of[0]) / 16000 / (times[-1] - times[0]), 3),
        "gaps_ms": [round(g * 1000, 1) for g in gaps],
    }


def plot(result: dict[str, Any], path: Path) -> None:
    """Recovery times and the streaming session's frame gaps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    rec = result.get("recovery", {}).get("seconds", [])
    axes[0].bar(range(1, len(rec) + 1), rec, color="tab:blue")
    axes[0].axhline(5, color="tab:red", ls="--", label="goal 5 s")
    axes[0].set(xlabel="crash", ylabel="s", title="SIGSEGV mid-answer -> next answer's first token")
    axes[0].legend()
    live = result.get("live")
    if live:
        axes[1].hist(live["gaps_ms"], bins=60, color="tab:green")
        axes[1].axvline(200, color="tab:red", ls="--", label="200 ms")
        axes[1].set(xlabel="gap between frames at the client, ms", ylabel="count", yscale="log",
                    title=f"streaming session, {len(live['recovery_seconds'])} model crashes")
        axes[1].legend()
    fig.suptitle(f"model process: {result['cpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: list[str] | None = None) -> int:
    """Run the parts asked for and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--native-python", default=None, help="an interpreter with a native llama.cpp build")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--crashes", type=int, default=5)
    parser.add_argument("--avatars-dir", type=Path, default=None, help="run the live part on these avatars")
    parser.add_argument("--avatar", default="sample")
    parser.add_argument("--live-only", action="store_true", help="only the live part (and memory)")
    parser.add_argument("--out", type=Path, default=RESULTS / "llm_process_bench.json")
    args = parser.parse_args(argv)
    result: dict[str, Any] = {"cpu": cpu_model(), "date": time.strftime("%Y-%m-%d"), "lipstream": str(TREE),
                              "load_average_start": os.getloadavg()}  # fmt: skip
    if not args.live_only:
        result["speed"] = measure_speed(args)
        result["recovery"] = measure_recovery(args)
    if args.avatars_dir is not None:
        proc, url = start_agent_server(args.avatars_dir)
        try:
            result["live"] = asyncio.run(live_crashes(url, args.avatar, args.crashes))
        finally:
            proc.terminate()
            proc.wait(timeout=20)
        result["idle_memory"] = idle_memory(args.avatars_dir)
    result["load_average_end"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.out.with_suffix(".png"))
    shown = {k: v for k, v in result.items() if k != "live"}
    if "live" in result:
        shown["live"] = {k: v for k, v in result["live"].items() if k != "gaps_ms"}
    print(json.dumps(shown, indent=2))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

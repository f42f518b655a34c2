"""A witness session streams while abusive clients run, one case after another (issue 11).

Reports the witness's worst stall beyond the 40 ms cadence (as a player with a 150 ms jitter buffer would
see it, and as raw arrival gaps), server memory over time, and each case's outcome. `--compare-with DIR`
runs the same cases against another checkout (e.g. the code before the fix) in the same invocation.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks abuse --avatars-dir out/home/avatars \
        [--compare-with /tmp/old]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import re
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import av
import numpy as np
import websockets

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO))  # after PYTHONPATH: a before/after run names its own lipstream there

from bench_common import JITTER_S, cpu_model, open_session  # noqa: E402

from lipstream.server.protocol import Kind, MediaMessage, decode_media  # noqa: E402

FRAME_S = 0.04


class Server:
    """`lipstream serve` from a checkout, in a subprocess; memory sampled every 0.25 s."""

    def __init__(self, repo: Path, avatars_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "lipstream", "serve", "--port", "0", "--avatars-dir", str(avatars_dir)],
            cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        for line in self.proc.stdout:  # type: ignore[union-attr]
            match = re.search(r"http://[\d.]+:(\d+)", line)
            if match:
                self.port = int(match.group(1))
                break
        else:
            raise RuntimeError("server did not start")
        self.ws = f"ws://127.0.0.1:{self.port}/ws"
        self.memory: list[tuple[float, float, float]] = []  # (time, VmRSS MiB, RssAnon MiB)
        self._stop = threading.Event()
        threading.Thread(target=self._sample, daemon=True).start()

    def rss(self) -> tuple[float, float]:
        """(VmRSS, RssAnon) in MiB."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        get = lambda key: int(re.search(key + r":\s+(\d+)", status).group(1)) / 1024  # noqa: E731
        return get("VmRSS"), get("RssAnon")

    def _sample(self) -> None:
        while not self._stop.is_set() and self.proc.poll() is None:
            with_time = (time.monotonic(), *self.rss())
            self.memory.append(with_time)
            time.sleep(0.25)

    def stop(self) -> None:
        """Terminate the process."""
        self._stop.set()
        self.proc.terminate()
        self.proc.wait(timeout=20)


@dataclass
class Witness:
    """A well-behaved session that plays what it receives (in simulation) and reports its position."""

    ws: websockets.ClientConnection
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, pts)
    t0: float | None = None

    async def run(self, stop: asyncio.Event) -> None:
        """Receive until `stop`, sending positions every 100 ms."""
        last = 0.0
        while not stop.is_set():
            try:
                data = await asyncio.wait_for(self.ws.recv(), 0.05)
            except asyncio.TimeoutError:
                data = None
            now = time.monotonic()
            if isinstance(data, bytes):
                msg = decode_media(data)
                if msg.kind == Kind.VIDEO:
                    if self.t0 is None:
                        self.t0 = now + JITTER_S
                    self.arrivals.append((now, msg.pts))
            if self.t0 is not None and now > self.t0 and now - last > 0.1:
                await self.ws.send(json.dumps({"type": "position", "pts": int((now - self.t0) * 16000)}))
                last = now

    def stalls(self, start: float, end: float) -> dict:
        """Worst display stall beyond cadence and worst arrival gap, for frames arriving in [start, end)."""
        assert self.t0 is not None
        shown_prev = None
        worst_stall = 0.0
        late = 0
        frames = [(at, pts) for at, pts in self.arrivals if start <= at < end]
        for at, pts in frames:
            due = self.t0 + pts / 16000
            shown = max(due, at)
            late += at > due
            if shown_prev is not None:
                worst_stall = max(worst_stall, shown - shown_prev - FRAME_S)
            shown_prev = shown
        times = [at for at, _ in frames]
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        return {
            "frames": len(frames),
            "worst_stall_ms": round(worst_stall * 1000, 1),
            "late_frames": late,
            "max_arrival_gap_ms": round(max(gaps, default=0.0) * 1000, 1),
        }


async def collect_errors(ws, seconds: float) -> list[str]:
    """Error codes received on `ws` within `seconds` (media skipped)."""
    codes: list[str] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            data = await asyncio.wait_for(ws.recv(), max(0.05, end - time.monotonic()))
        except (asyncio.TimeoutError, websockets.ConnectionClosed):
            break
        if isinstance(data, str) and json.loads(data)["type"] == "error":
            codes.append(json.loads(data)["code"])
    return codes


def wav_claiming(rate: int, payload: bytes) -> bytes:
    """A mono 16-bit WAV whose header declares `rate`."""
    fmt = struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
    return b"RIFF" + struct.pack("<I", 36 + len(payload)) + b"WAVEfmt " + fmt + (
        b"data" + struct.pack("<I", len(payload)) + payload
    )


def silent_flac(seconds: float, rate: int = 8000) -> bytes:
    """Silence as FLAC, made in memory."""
    buf = io.BytesIO()
    with av.open(buf, "w", format="flac") as out:
        stream = out.add_stream("flac", rate=rate, layout="mono")
        done, total = 0, int(seconds * rate)
        while done < total:
            n = min(rate * 10, total - done)
            frame = av.AudioFrame.from_ndarray(np.zeros((1, n), np.int16), format="s16", layout="mono")
            frame.sample_rate, frame.pts = rate, done
            done += n
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return buf.getvalue()


# ---- the cases: each returns its outcome ----


async def case_upload_1hz(server: Server, avatar: str) -> dict:
    ws, _ = await open_session(server.ws, avatar)
    await ws.send(MediaMessage(Kind.UPLOAD, wav_claiming(1, bytes(32_000))).encode())
    codes = await collect_errors(ws, 4)
    await ws.close()
    return {"expected": ["bad_audio"], "got": codes}


async def case_upload_flac_2h(server: Server, avatar: str) -> dict:
    ws, _ = await open_session(server.ws, avatar)
    await ws.send(MediaMessage(Kind.UPLOAD, TWO_HOUR_FLAC[0]).encode())
    codes = await collect_errors(ws, 6)
    await ws.close()
    return {"expected": ["bad_audio"], "got": codes}


async def case_speak_flood(server: Server, avatar: str) -> dict:
    ws, _ = await open_session(server.ws, avatar)
    text = ("The quick brown fox jumps over the lazy dog near the river bank. " * 62)[:4000]
    for _ in range(30):
        await ws.send(json.dumps({"type": "speak", "text": text}))
    codes = await collect_errors(ws, 8)
    await ws.close()
    return {"expected": ["queue_full"] * 25, "got": codes}


async def case_pcm_flood(server: Server, avatar: str) -> dict:
    ws, _ = await open_session(server.ws, avatar)
    chunk = (np.sin(np.arange(16000 * 30) / 7.0) * 8000).astype("<i2").tobytes()
    for _ in range(10):
        await ws.send(MediaMessage(Kind.PCM, chunk, aux=16000).encode())
        await ws.send(json.dumps({"type": "flush"}))
    codes = await collect_errors(ws, 6)
    await ws.close()
    return {"expected": ["queue_full"] * 4, "got": codes}


async def case_wide_output(server: Server, avatar: str) -> dict:
    ws, ready = await open_session(server.ws, avatar, output_width=4096)
    await collect_errors(ws, 2)
    await ws.close()
    got = [ready.get("width"), ready.get("code")]
    return {"expected": "ready at the avatar's own width or less", "got": got}


async def case_huge_position(server: Server, avatar: str) -> dict:
    ws, _ = await open_session(server.ws, avatar)
    frames = 0
    start = time.monotonic()
    while time.monotonic() - start < 4:
        await ws.send(json.dumps({"type": "position", "pts": 2**52}))
        end = time.monotonic() + 0.1
        while time.monotonic() < end:
            try:
                data = await asyncio.wait_for(ws.recv(), max(0.01, end - time.monotonic()))
            except asyncio.TimeoutError:
                break
            frames += isinstance(data, bytes) and decode_media(data).kind == Kind.VIDEO
    await ws.send('{"type": "position", "pts": 1' + "0" * 400 + "}")
    codes = await collect_errors(ws, 1)
    await ws.close()
    return {"expected": "about 25 frames/s and bad_message", "got": [round(frames / 4, 1), codes]}


async def case_malformed(server: Server, avatar: str) -> dict:
    got = []
    for raw in ("[" * 20_000 + "]" * 20_000, '{"type": "hello", "version": "1", "avatar": "x"}',
                json.dumps({"type": "hello", "version": 1, "pad": "x" * (8 * 1024 * 1024 + 1)})):
        ws = await websockets.connect(server.ws, max_size=None)
        await ws.send(raw)
        got += await collect_errors(ws, 3)
        await ws.close()
    ws, _ = await open_session(server.ws, avatar)
    await ws.send(json.dumps({"type": "speak", "text": "nul\u0000here"}))
    await ws.send('{"type": "speak", "text": "lone \\ud800 surrogate"}')
    got += await collect_errors(ws, 3)
    await ws.close()
    return {"expected": ["bad_message", "bad_message", "too_large", "bad_text", "bad_text"], "got": got}


async def case_idle_sockets(server: Server, avatar: str) -> dict:
    socks = []
    for _ in range(200):
        sock = socket.socket()
        sock.setblocking(False)
        try:
            sock.connect_ex(("127.0.0.1", server.port))
        except OSError:
            pass
        socks.append(sock)
    await asyncio.sleep(12.0)  # the request-head deadline is 10 s
    closed = refused = 0
    for sock in socks:
        try:
            first = sock.recv(64)
            closed += first == b""
            refused += first.startswith(b"HTTP/1.1 503")  # over the connection cap: 503, then closed
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        sock.close()
    still_open = 200 - closed - refused
    got = f"{closed} closed after the deadline, {refused} refused at the cap (503), {still_open} open"
    return {"expected": "none left open", "got": got}


async def case_churn(server: Server, avatar: str) -> dict:
    for i in range(100):
        ws, _ = await open_session(server.ws, avatar, **({"output_width": 540} if i % 2 else {}))
        await ws.send(json.dumps({"type": "speak", "text": "Hello there, this is a short churn test."}))
        await collect_errors(ws, 0.4)
        await ws.close()
    return {"expected": "100 sessions opened and closed", "got": "done"}


CASES: list[tuple[str, Callable[[Server, str], Awaitable[dict]]]] = [
    ("upload WAV claiming 1 Hz", case_upload_1hz),
    ("upload 2 h FLAC of silence", case_upload_flac_2h),
    ("30 speak x 4000 chars", case_speak_flood),
    ("10 x 30 s of PCM", case_pcm_flood),
    ("output_width 4096", case_wide_output),
    ("position pts 2^52, then 10^400", case_huge_position),
    ("malformed messages", case_malformed),
    ("200 idle TCP sockets", case_idle_sockets),
    ("100 connect-speak-disconnect", case_churn),
]


async def run_all(server: Server, avatar: str, witness_width: int | None) -> dict:
    """Warm up, then run every case while the witness streams; outcomes, stalls and memory."""
    size = {"output_width": witness_width} if witness_width else {}
    ws, ready = await open_session(server.ws, avatar, **size)
    witness = Witness(ws)
    stop = asyncio.Event()
    watcher = asyncio.create_task(witness.run(stop))
    await case_churn_warm(server, avatar)
    await asyncio.sleep(3.0)
    base_rss = server.rss()
    results = []
    before = witness.stalls(time.monotonic() - 2.5, time.monotonic())
    for name, case in CASES:
        start = time.monotonic()
        try:
            outcome = await case(server, avatar)
        except Exception as exc:  # noqa: BLE001 - a case the server fails is an outcome, not a crash here
            outcome = {"expected": "-", "got": f"client error: {exc!r}"[:200]}
        end = time.monotonic()
        outcome.update(name=name, seconds=round(end - start, 1), witness=witness.stalls(start, end))
        print(f"  {name}: {outcome['got']} | witness {outcome['witness']}", flush=True)
        results.append(outcome)
    await asyncio.sleep(4.0)
    end_rss = server.rss()
    stop.set()
    await watcher
    await ws.close()
    all_stalls = [r["witness"]["worst_stall_ms"] for r in results]
    return {
        "witness": {"width": ready.get("width"), "height": ready.get("height"), "idle_before": before},
        "cases": results,
        "worst_witness_stall_ms": max(all_stalls),
        "rss_mib": {
            "start": [round(v) for v in base_rss],
            "end": [round(v) for v in end_rss],
            "peak": [round(max(m[1] for m in server.memory)), round(max(m[2] for m in server.memory))],
        },
        "memory": [(round(t - server.memory[0][0], 2), round(r), round(a)) for t, r, a in server.memory],
    }


async def case_churn_warm(server: Server, avatar: str) -> None:
    """A few sessions first, so voices, caches and pools exist before the baseline is taken."""
    for i in range(3):
        ws, _ = await open_session(server.ws, avatar, **({"output_width": 540} if i % 2 else {}))
        await ws.send(json.dumps({"type": "speak", "text": "Warming up."}))
        await collect_errors(ws, 1.0)
        await ws.close()


def plot(runs: dict, path: Path) -> None:
    """Server memory over time and the witness's stall per case, one line per checkout."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem, stall) = plt.subplots(2, 1, figsize=(10, 7))
    for label, run in runs.items():
        t = [m[0] for m in run["memory"]]
        mem.plot(t, [m[2] for m in run["memory"]], label=f"{label}: heap (RssAnon)")
        mem.plot(t, [m[1] for m in run["memory"]], "--", label=f"{label}: VmRSS")
        worst = [c["witness"]["worst_stall_ms"] for c in run["cases"]]
        stall.bar([str(i) for i in range(len(worst))], worst, alpha=0.6, label=label)
    mem.set_xlabel("seconds")
    mem.set_ylabel("MiB")
    mem.legend(fontsize=8)
    stall.axhline(200, color="red", linewidth=1, label="goal 200 ms")
    stall.set_xlabel("case (order as in the JSON)")
    stall.set_ylabel("witness worst stall beyond cadence, ms")
    stall.set_yscale("symlog", linthresh=10)
    stall.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


TWO_HOUR_FLAC: list[bytes] = []  # made once before any witness runs (encoding it takes seconds)


def main(argv: list[str] | None = None) -> int:
    """Run the cases against this checkout (and another, if asked) and write JSON and a PNG."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--avatars-dir", type=Path, required=True)
    parser.add_argument("--avatar", default="sample")
    parser.add_argument("--witness-width", type=int, default=None, help="witness stream width (default full)")
    parser.add_argument("--compare-with", type=Path, default=None, help="another checkout to run first")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "abuse_bench.json")
    args = parser.parse_args(argv)
    checkouts = ([("before", args.compare_with)] if args.compare_with else []) + [("after", REPO)]
    TWO_HOUR_FLAC.append(silent_flac(7200))
    runs: dict = {}
    for label, repo in checkouts:
        print(f"{label}: {repo}", flush=True)
        server = Server(repo, args.avatars_dir.resolve())
        try:
            runs[label] = asyncio.run(run_all(server, args.avatar, args.witness_width))
        finally:
            server.stop()
        r = runs[label]
        print(f"{label}: worst witness stall {r['worst_witness_stall_ms']} ms; RSS/heap MiB start "
              f"{r['rss_mib']['start']} end {r['rss_mib']['end']} peak {r['rss_mib']['peak']}", flush=True)
    result = {"date": time.strftime("%Y-%m-%d"), "cpu": cpu_model(), "avatar": args.avatar, "runs": runs}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    plot(runs, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

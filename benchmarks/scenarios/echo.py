"""Server-side echo canceller (issue 9): cost per 20 ms microphone chunk, echo removed, delay error,
silero VAD false triggers on the avatar's own voice, and the user's voice kept during double talk.

The avatar speaks 10 s of Piper speech; the microphone hears it delayed (40/120/250 ms), ×0.3, directly
or through synthetic 30 ms rooms, with noise 35 dB down; the double-talk runs add espeak-ng words at 2 s
and 6 s, as loud as the echo. Everything is measured after 1.5 s (convergence) unless named otherwise.

    .venv/bin/python -m benchmarks echo [--out benchmarks/results/echo_bench.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
sys.path.append(str(REPO))  # after PYTHONPATH: a before/after run names its own lipstream there

from bench_common import cpu_model  # noqa: E402

from lipstream.talk.hearing.echo import EchoCanceller  # noqa: E402
from lipstream.talk.hearing.vad import SileroModel, VoiceActivityDetector  # noqa: E402
from lipstream.talk.voices.tts import create_tts  # noqa: E402

SR = 16000
CHUNK = 320
FRAME = 640
SETTLED = int(1.5 * SR)
LEAD = SR
AVATAR_TEXT = (
    "Good evening, and welcome back. Today I would like to tell you about the mountains in the north, "
    "where the weather changes quickly and the rivers run cold all year. Some people walk there every "
    "summer, and a few of them even swim in the lakes, which is braver than it sounds."
)
USER_TEXT = ("Wait, stop, I have a question.", "Sorry, one more thing.")
USER_AT = (2 * SR, 6 * SR)


def room(seed: int) -> np.ndarray:
    """A synthetic 30 ms room: exponentially decaying random taps (τ = 5 ms), unit energy."""
    rng = np.random.default_rng(seed)
    n = int(0.030 * SR)
    h = rng.standard_normal(n) * np.exp(-np.arange(n) / (0.005 * SR))
    return h / np.sqrt(np.sum(h**2))


def echo_of(avatar: np.ndarray, delay_ms: float, path: np.ndarray | None, seed: int) -> np.ndarray:
    """The avatar as the microphone hears it: delayed, ×0.3, through `path`, plus noise."""
    d = int(delay_ms * SR / 1000)
    h = 0.3 * (path if path is not None else np.ones(1))
    echo = np.concatenate([np.zeros(d), np.convolve(avatar, h)[: len(avatar)]])[: len(avatar)]
    return echo + np.random.default_rng(seed).standard_normal(len(echo)) * 5e-4


def run(avatar: np.ndarray, mic: np.ndarray) -> tuple[np.ndarray, EchoCanceller, np.ndarray, float | None]:
    """Stream like the server: reference frames at their pts, 20 ms mic chunks with exact positions.
    Returns output, canceller, [wall, thread CPU] seconds per chunk, and when the delay was locked (s)."""
    ec = EchoCanceller()
    pcm16 = np.clip(np.round(avatar * 32767), -32768, 32767).astype(np.int16)
    sent = 0
    out = np.zeros(len(mic), dtype=np.float32)
    cost, cpu = [], []
    locked = None
    for i in range(0, len(mic), CHUNK):
        # The server's frames run up to 1 s ahead of playback (Session.max_lead_seconds).
        while sent < min(len(pcm16), i + LEAD):
            ec.add_reference(sent, pcm16[sent : sent + FRAME])
            sent += FRAME
        piece = mic[i : i + CHUNK].astype(np.float32)
        t0, c0 = time.perf_counter(), time.thread_time()
        out[i : i + len(piece)] = ec.process(piece, i + len(piece) - 1)
        cost.append(time.perf_counter() - t0)
        cpu.append(time.thread_time() - c0)
        if locked is None and ec.stats.delay_ms is not None:
            locked = (i + len(piece)) / SR
    return out, ec, np.array([cost, cpu]), locked


def db(x: np.ndarray) -> float:
    x = np.asarray(x, dtype=np.float64)
    return 10 * float(np.log10(np.mean(x * x) + 1e-20))


def speech_starts(model: SileroModel, pcm: np.ndarray, offset: int = 0) -> list[float]:
    """Seconds where the barge-in VAD (≥ 200 ms of speech) says speech starts."""
    vad = VoiceActivityDetector(start_ms=200, model=model)
    return [(offset + e.sample) / SR for e in vad.push(pcm.astype(np.float32)) if e.kind == "speech_start"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "echo_bench.json")
    args = parser.parse_args(argv)

    avatar = create_tts("piper").synthesize(AVATAR_TEXT).pcm[: 10 * SR].astype(np.float64)
    espeak = create_tts("espeak")
    users = [espeak.synthesize(t).pcm.astype(np.float64) for t in USER_TEXT]
    model = SileroModel()
    cases = []
    all_cost: list[np.ndarray] = []
    for delay_ms in (40, 120, 250):
        for room_seed in (None, 1, 2):
            path = room(room_seed) if room_seed is not None else None
            echo = echo_of(avatar, delay_ms, path, seed=delay_ms)
            out, ec, cost, locked = run(avatar, echo)
            all_cost.append(cost)
            windows = [
                db(echo[k : k + SR // 2]) - db(out[k : k + SR // 2])
                for k in range(SETTLED, len(echo), SR // 2)
            ]
            case = {
                "delay_ms": delay_ms,
                "room": "direct" if room_seed is None else f"room{room_seed}",
                "delay_locked_s": locked,
                "delay_estimate_ms": ec.stats.delay_ms,
                "delay_error_ms": None
                if ec.stats.delay_ms is None
                else round(ec.stats.delay_ms - delay_ms, 2),
                "attenuation_db": round(db(echo[SETTLED:]) - db(out[SETTLED:]), 1),
                "worst_half_second_db": round(min(windows), 1),
                "erle_db_stat": round(ec.stats.erle_db, 1),
                "vad_starts_raw_mic": len(speech_starts(model, echo[SETTLED:])),
                "vad_starts_output": len(speech_starts(model, out[SETTLED:])),
                "vad_starts_output_from_0s": len(speech_starts(model, out)),
            }
            # Double talk: the same echo plus the user's words at 2 s and 6 s, each as loud as the echo there.
            words = np.zeros(len(echo))
            spans = []
            for at, u in zip(USER_AT, users, strict=True):
                end = min(len(echo), at + len(u))
                level = np.sqrt(np.mean(echo[at:end] ** 2) / np.mean(u[: end - at] ** 2))
                words[at:end] = u[: end - at] * level
                spans.append((at, end))
            out2, _, cost2, _ = run(avatar, echo + words)
            all_cost.append(cost2)
            kept = [db(out2[a:b]) - db(words[a:b]) for a, b in spans]
            gains = [
                20 * np.log10(abs(np.dot(out2[a:b], words[a:b]) / np.dot(words[a:b], words[a:b])))
                for a, b in spans
            ]
            starts = speech_starts(model, out2[SETTLED:], SETTLED)
            start_err = [min((abs(s - a / SR) for s in starts), default=None) for a, _ in spans]
            case["double_talk"] = {
                "user_energy_kept_db": [round(k, 2) for k in kept],
                "user_component_gain_db": [round(float(g), 2) for g in gains],
                "vad_start_error_ms": [None if e is None else round(e * 1000) for e in start_err],
                "vad_starts": [round(s, 3) for s in starts],
            }
            cases.append(case)
            print(
                f"{delay_ms:3d} ms {case['room']:6s}: lock {locked:.2f}s err {case['delay_error_ms']} ms, "
                f"removed {case['attenuation_db']} dB (worst 0.5 s {case['worst_half_second_db']}), "
                f"VAD raw {case['vad_starts_raw_mic']} → out {case['vad_starts_output']}; "
                f"double talk kept {case['double_talk']['user_energy_kept_db']} dB, "
                f"start err {case['double_talk']['vad_start_error_ms']} ms"
            )
    cost_ms = np.concatenate(all_cost, axis=1) * 1000
    chunk_ms = CHUNK * 1000 / SR

    def spread(ms: np.ndarray) -> dict[str, float]:
        stats = {"mean": float(ms.mean()), "max": float(ms.max())}
        stats.update({f"p{q}": float(np.percentile(ms, q)) for q in (50, 95, 99)})
        stats["real_time_fraction"] = stats["mean"] / chunk_ms
        return {k: round(v, 4) for k, v in stats.items()}

    summary = {
        # Wall time includes whatever else the 2 shared cores were doing; thread CPU time is ours alone.
        "ms_per_20ms_chunk_wall": spread(cost_ms[0]),
        "ms_per_20ms_chunk_cpu": spread(cost_ms[1]),
        "attenuation_db_min": min(c["attenuation_db"] for c in cases),
        "attenuation_db_mean": round(float(np.mean([c["attenuation_db"] for c in cases])), 1),
        "delay_abs_error_ms_max": max(
            abs(c["delay_error_ms"]) for c in cases if c["delay_error_ms"] is not None
        ),
        "delay_locked_s_max": max(c["delay_locked_s"] or 99 for c in cases),
        "vad_false_starts_output": sum(c["vad_starts_output"] for c in cases),
        "vad_false_starts_raw_mic": sum(c["vad_starts_raw_mic"] for c in cases),
        "double_talk_kept_db_range": [
            min(min(c["double_talk"]["user_energy_kept_db"]) for c in cases),
            max(max(c["double_talk"]["user_energy_kept_db"]) for c in cases),
        ],
        "double_talk_vad_start_error_ms_max": max(
            max(e if e is not None else 10**6 for e in c["double_talk"]["vad_start_error_ms"]) for c in cases
        ),
    }
    print(json.dumps(summary, indent=2))
    result = {
        "cpu": cpu_model(),
        "setup": {
            "avatar_s": round(len(avatar) / SR, 2),
            "echo_gain": 0.3,
            "noise_rms": 5e-4,
            "chunk_samples": CHUNK,
            "settled_after_s": SETTLED / SR,
            "user_at_s": [a / SR for a in USER_AT],
        },
        "summary": summary,
        "cases": cases,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

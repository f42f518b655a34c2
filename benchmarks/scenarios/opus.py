"""Opus vs PCM audio (issue 24 item 2): three full-size pages in patch mode at once, per session, at the page.

One `lipstream serve` process, the real page in headless Chromium (tests/browser/player.mjs, scenario
`pages`): three pages open the same avatar in patch mode, all speak the same text at once; then the same with
the other audio codec. PCM and Opus runs alternate (`--rounds` each) so that the machine's load drifts over
both alike. Per page: kbit/s received by the page (every WebSocket message, headers and JSON included) over
the whole session, from the speak click to the end (the speech window: its audio's share too) and over the
speech frames' messages alone (the rate while the avatar talks, whatever the idle/speech mix); A/V offset
p95, speak -> first speech frame on screen, dropped frames. Also the Opus encode cost per frame, in process.

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks opus --avatars-dir out/home/avatars \
        --out benchmarks/results/opus_bench.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_common import cpu_model  # noqa: E402

from benchmarks.scenarios.browser import drive, start_server  # noqa: E402
from lipstream.media.opus import FrameAudioDecoder, FrameAudioEncoder  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TEXT = (
    "Good evening, and welcome to the late news. Tonight we look at the weather along the coast, where "
    "strong winds are expected to ease by the morning. In the city, the new bridge opened to traffic after "
    "three years."
)


def _kbit(nbytes: float, frames: float) -> float:
    """kbit/s of stream time: the session sends 25 frames a second."""
    return round(nbytes * 8 / 1000 / max(frames / 25, 1e-9), 1)


def page_figures(before: dict, after: dict) -> dict:
    """One page's figures from its snapshot before speaking and after playback finished."""
    frames = after.get("framesReceived") or 0
    speech_frames = frames - (before.get("framesReceived") or 0)
    speech_bytes = (after.get("bytesReceived") or 0) - (before.get("bytesReceived") or 0)
    speech_audio = (after.get("audioBytes") or 0) - (before.get("audioBytes") or 0)
    offset = after.get("avOffsetMs") or {}
    return {
        "audio_codec": after.get("audioCodec"),
        "stream": after.get("stream"),
        "kbit_per_s_session": _kbit(after.get("bytesReceived") or 0, frames),
        "kbit_per_s_speech_window": _kbit(speech_bytes, speech_frames),
        # speech frames' messages only (flag `speaking`): the rate while the avatar talks, whatever the mix
        "kbit_per_s_while_speaking": _kbit(
            after.get("speechBytes") or 0, after.get("speechAudioFrames") or 0
        ),
        "audio_kbit_per_s_speech_window": _kbit(speech_audio, speech_frames),
        "av_offset_ms": {k: round(offset.get(k, 0), 1) for k in ("p50", "p95", "max")},
        "speak_to_first_speech_frame_ms": round(after["ttffMs"]) if after.get("ttffMs") is not None else None,
        "frames_dropped": after.get("framesDropped"),
        "frames_shown": after.get("framesShown"),
        "speech_frames_shown": after.get("speechFramesShown"),
        "audio_late_reanchors": after.get("audioLate"),
        "decode_errors": after.get("decodeErrors"),
    }


def run_pages(url: str, avatar: str, audio: str, pages: int) -> dict:
    """One run: `pages` pages in patch mode with this audio codec, speaking TEXT at once."""
    options = {
        "url": url, "scenario": "pages", "avatars": [avatar] * pages, "stream": "patch", "audio": audio,
        "text": TEXT, "timeoutMs": 180000,
    }  # fmt: skip
    load = [round(v, 2) for v in os.getloadavg()]
    result = drive(options)
    return {
        "audio": audio,
        "load_average_start": load,
        "pages": [
            page_figures(b, a) for b, a in zip(result.get("before", []), result.get("snaps", []), strict=True)
        ],
        "problems": result.get("problems", []),
        "failed": result.get("failed"),
    }


def encode_cost(frames: int = 500) -> dict:
    """Server-side Opus encode (and a client's PyAV decode) per 40 ms frame, on a speech-like signal."""
    t = np.arange(frames * 640) / 16000
    f0 = 120 + 30 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 16000
    voice = sum(np.sin(k * phase) / k for k in range(1, 25)) * np.clip(np.sin(2 * np.pi * 1.3 * t), 0, 1)
    pcm = (voice / np.abs(voice).max() * 12000).astype(np.int16)
    encoder, decoder = FrameAudioEncoder(), FrameAudioDecoder()
    packets, enc_s, dec_s = [], 0.0, 0.0
    for k in range(frames):
        t0 = time.process_time()
        out, restarted = encoder.encode(k * 640, pcm[k * 640 : (k + 1) * 640])
        enc_s += time.process_time() - t0
        t0 = time.process_time()
        decoder.decode(out, restarted)
        dec_s += time.process_time() - t0
        packets.append(out)
    return {
        "frames": frames,
        "encode_cpu_ms_per_frame": round(enc_s / frames * 1000, 3),
        "decode_cpu_ms_per_frame": round(dec_s / frames * 1000, 3),
    }


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 1) if values else float("nan")


def summarise(runs: list[dict]) -> dict:
    """Per codec over every page of every round: means of the rates, worst A/V p95, ttff, all drops."""
    out = {}
    for audio in ("pcm", "opus"):
        pages = [p for r in runs if r["audio"] == audio for p in r["pages"]]
        ttff = [p["speak_to_first_speech_frame_ms"] for p in pages if p["speak_to_first_speech_frame_ms"]]
        out[audio] = {
            "pages": len(pages),
            "codec_seen": sorted({str(p["audio_codec"]) for p in pages}),
            "streams_seen": sorted({str(p["stream"]) for p in pages}),
            "kbit_per_s_session": _mean([p["kbit_per_s_session"] for p in pages]),
            "kbit_per_s_while_speaking": _mean([p["kbit_per_s_while_speaking"] for p in pages]),
            "kbit_per_s_speech_window": _mean([p["kbit_per_s_speech_window"] for p in pages]),
            "audio_kbit_per_s_speech_window": _mean([p["audio_kbit_per_s_speech_window"] for p in pages]),
            "av_offset_p95_ms": [p["av_offset_ms"]["p95"] for p in pages],
            "speak_to_first_speech_frame_ms": ttff,
            "frames_dropped": [p["frames_dropped"] for p in pages],
            "decode_errors": sum(p["decode_errors"] or 0 for p in pages),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    """PCM and Opus rounds against one server; print side by side and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--avatars-dir", type=Path, required=True)
    parser.add_argument("--avatar", default="sample")
    parser.add_argument("--pages", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2, help="PCM and Opus runs each, alternating")
    parser.add_argument("--patch-kbps", type=float, default=None, help="passed to lipstream serve")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "opus_bench.json")
    args = parser.parse_args(argv)
    results: dict = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "avatar": args.avatar,
        "pages": args.pages,
        "patch_kbps": args.patch_kbps,
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "opus_cost": encode_cost(),
        "runs": [],
    }
    extra = [] if args.patch_kbps is None else ["--patch-kbps", str(args.patch_kbps)]
    proc, url = start_server(args.avatars_dir, extra)
    try:
        # the base loop is built once, on its first request: before the runs, not inside one
        curl = ["curl", "-s", "-o", "/dev/null", f"{url}/edge/{args.avatar}/export.json"]
        subprocess.run(curl, capture_output=True, timeout=900, check=False)
        for _ in range(args.rounds):
            for audio in ("pcm", "opus"):
                run = run_pages(url, args.avatar, audio, args.pages)
                results["runs"].append(run)
                for page in run["pages"]:
                    print(f"{audio}: {json.dumps(page)}")
                if run["failed"] or run["problems"]:
                    print(f"{audio}: failed {run['failed']} problems {run['problems'][:5]}")
    finally:
        proc.terminate()
        proc.wait()
    results["summary"] = summarise(results["runs"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"opus cost: {results['opus_cost']}")
    summary = results["summary"]
    for key in summary["pcm"]:
        print(f"{key:34s} | pcm {summary['pcm'][key]} | opus {summary['opus'][key]}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

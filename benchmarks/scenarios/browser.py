"""The player page in headless Chromium, ~30 s utterance: A/V offset p50/p95, drops, decode errors, interrupt.

Full size and half size in one run, against one `lipstream serve` process (viseme engine).

    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks browser --avatars-dir out/home/avatars

Patch stream mode (issue 12): full-frame vs patch side by side at the avatar's own size, one server:
    OMP_NUM_THREADS=1 .venv/bin/python -m benchmarks browser --avatars-dir out/home/avatars --streams \
        --out benchmarks/results/browser_patch_bench.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path

import bench_common

REPO = Path(__file__).resolve().parents[2]
BROWSER_DIR = REPO / "tests" / "browser"
LONG_TEXT = (
    "Good evening, and welcome to the late news. Tonight we look at the weather along the coast, where "
    "strong winds are expected to ease by the morning. In the city, the new bridge opened to traffic after "
    "three years of work, and early reports say the journey across the river is now ten minutes shorter. "
    "In sport, the home team won their third match in a row, and the coach said the players had earned a "
    "quiet weekend. Finally, the museum on the hill will open late on Fridays this summer, with music in the "
    "garden and free entry for children. That is all for tonight. Thank you for watching, and good night."
)


TWO_PAGES_TEXT = (
    "Two pages are playing at once from the same server, and each of them should keep its own clock "
    "without dropping a single frame."
)


def start_server(avatars_dir: Path, extra: list[str] | None = None) -> tuple[subprocess.Popen, str]:
    """`lipstream serve --port 0` (and `extra` arguments); returns the process and its http URL."""
    proc, http, _ = bench_common.start_server(["--avatars-dir", str(avatars_dir), *(extra or [])], cwd=REPO)
    return proc, http


def drive(options: dict, script: str = "player.mjs") -> dict:
    """One run of a tests/browser driver (player.mjs, patch.mjs)."""
    done = subprocess.run(
        ["node", script, json.dumps(options)],
        cwd=BROWSER_DIR,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = [ln for ln in done.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(line)


def _quantiles(values: list[float]) -> dict:
    ordered = sorted(values)
    if not ordered:
        return {}
    pick = lambda q: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)  # noqa: E731
    return {"p50": pick(0.5), "p95": pick(0.95), "max": round(ordered[-1], 2), "count": len(ordered)}


def compare_streams(url: str, avatar: str) -> dict:
    """Full-frame vs patch mode in Chromium: A/V offset, drops, speak -> first speech frame, compositor ms
    on the main thread, bitrate at the browser, base-loop download, first frame with a cold and warm cache."""
    import os

    out: dict = {"load_average_start": [round(v, 2) for v in os.getloadavg()]}
    # the server builds the avatar's base-loop export once, on its first request: not part of a session's time
    curl = ["curl", "-s", "-o", "/dev/null", "-w", "%{time_total}", f"{url}/edge/{avatar}/export.json"]
    build = subprocess.run(curl, capture_output=True, text=True, timeout=600)
    out["export_build_or_fetch_s"] = float(build.stdout or 0)
    for mode in ("full", "patch"):
        base = {"url": url, "avatar": avatar, "avatars": [avatar], "timeoutMs": 120000, "stream": mode}
        if mode == "patch":
            speak = drive({**base, "scenario": "bench", "text": LONG_TEXT}, "patch.mjs")
        else:
            speak = drive({**base, "scenario": "speak", "text": LONG_TEXT})
        coldwarm = drive({**base, "scenario": "coldwarm"}, "patch.mjs")
        # two full-size pages against one server at once (issue 12 saw 6-8 drops each with whole frames)
        two = drive({**base, "scenario": "two", "avatars": [avatar, avatar], "text": TWO_PAGES_TEXT})
        snap = speak.get("snap", {})
        seconds = (snap.get("framesReceived") or 0) / 25
        sent = snap.get("patchBytes") if mode == "patch" else snap.get("videoBytes")
        patch = snap.get("patch") or {}
        out[mode] = {
            "speech_frames_shown": snap.get("speechFramesShown"),
            "av_offset_ms": snap.get("avOffsetMs"),
            "frames_shown": snap.get("framesShown"),
            "frames_dropped": snap.get("framesDropped"),
            "frames_late_over_40ms": snap.get("framesLate"),
            "decode_errors": snap.get("decodeErrors"),
            "speak_to_first_speech_frame_ms": snap.get("ttffMs"),
            "video_kbit_per_s_at_browser": round((sent or 0) * 8 / 1000 / max(seconds, 1e-9), 1),
            "compositor_ms_per_frame": _quantiles(patch.get("compositorMs") or []),
            "base_loop_bytes": patch.get("baseBytes"),
            "first_frame_ms": {r["label"]: r["firstFrameMs"] for r in coldwarm.get("runs", [])},
            "base_load_ms": {r["label"]: r["baseLoadMs"] for r in coldwarm.get("runs", [])},
            "two_pages": [
                {"av_offset_ms": t.get("avOffsetMs"), "frames_dropped": t.get("framesDropped"),
                 "frames_shown": t.get("framesShown"), "speech_frames_shown": t.get("speechFramesShown")}
                for t in two.get("snaps", [])
            ],  # fmt: skip
            "problems": speak.get("problems", []) + coldwarm.get("problems", []) + two.get("problems", []),
            "failed": speak.get("failed") or coldwarm.get("failed") or two.get("failed"),
        }
        r = out[mode]
        o = r["av_offset_ms"] or {}
        pages = [(t["frames_dropped"], (t["av_offset_ms"] or {}).get("p95")) for t in r["two_pages"]]
        print(
            f"{mode}: A/V p50 {o.get('p50', 0):.1f} p95 {o.get('p95', 0):.1f} ms | dropped "
            f"{r['frames_dropped']}/{r['frames_shown']} | speak->first speech frame "
            f"{r['speak_to_first_speech_frame_ms']} ms | "
            f"{r['video_kbit_per_s_at_browser']} kbit/s | compositor {r['compositor_ms_per_frame']} | "
            f"first frame {r['first_frame_ms']} | base {r['base_loop_bytes']} B {r['base_load_ms']} | "
            f"two pages (dropped, A/V p95) {pages}"
        )
    out["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    return out


def main(argv: list[str] | None = None) -> int:
    """Run both sizes and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--avatars-dir", type=Path, required=True)
    parser.add_argument("--avatar", default="sample")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "browser_bench.json")
    parser.add_argument("--streams", action="store_true", help="full-frame vs patch mode at full size only")
    parser.add_argument(
        "--serve-arg", action="append", default=[], help="a `lipstream serve` argument, repeatable"
    )
    args = parser.parse_args(argv)
    manifest = json.loads((args.avatars_dir / args.avatar / "manifest.json").read_text())
    w, h = manifest["width"], manifest["height"]
    proc, url = start_server(args.avatars_dir, args.serve_arg)
    results: dict = {"avatar": args.avatar, "sizes": {}, "serve_args": args.serve_arg}
    try:
        if args.streams:
            results["streams"] = compare_streams(url, args.avatar)
        for label, width in ((f"full {w}x{h}", None), (f"half {w // 2}x{h // 2}", w // 2)):
            if args.streams:
                break
            base = {"url": url, "avatars": [args.avatar], "timeoutMs": 120000, "width": width}
            base["stream"] = "full"  # the page's default is patch mode where it can composite
            speak = drive({**base, "scenario": "speak", "text": LONG_TEXT})
            interrupt = drive({**base, "scenario": "interrupt"})
            snap = speak.get("snap", {})
            results["sizes"][label] = {
                "speech_frames_shown": snap.get("speechFramesShown"),
                "utterance_seconds": round((snap.get("speechFramesShown") or 0) / 25, 1),
                "av_offset_ms": snap.get("avOffsetMs"),
                "frames_shown": snap.get("framesShown"),
                "frames_dropped": snap.get("framesDropped"),
                "frames_late_over_40ms": snap.get("framesLate"),
                "decode_errors": snap.get("decodeErrors"),
                "audio_late_reanchors": snap.get("audioLate"),
                "ttff_shown_ms": snap.get("ttffMs"),
                "ttff_received_ms": snap.get("ttffReceivedMs"),
                "interrupt_to_last_speech_frame_ms": interrupt.get("snap", {}).get("interruptMs"),
                "problems": speak.get("problems", []) + interrupt.get("problems", []),
                "failed": speak.get("failed") or interrupt.get("failed"),
            }
    finally:
        proc.terminate()
        proc.wait()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    for label, r in results["sizes"].items():
        o = r["av_offset_ms"] or {}
        print(
            f"{label}: {r['utterance_seconds']} s speech | A/V offset p50 {o.get('p50', 0):.1f} p95 "
            f"{o.get('p95', 0):.1f} max {o.get('max', 0):.1f} ms (n={o.get('count')}) | dropped "
            f"{r['frames_dropped']}/{r['frames_shown']} | decode errors {r['decode_errors']} | ttff shown "
            f"{r['ttff_shown_ms']} ms | interrupt->last speech frame "
            f"{r['interrupt_to_last_speech_frame_ms']} ms"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

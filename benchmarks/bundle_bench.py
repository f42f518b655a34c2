"""Bundle format 2 (issue 21): size, render and live figures side by side with format 1, and a long clip.

Part 1, the sample (`--v1 NAME`, a format-1 bundle in $LIPSTREAM_HOME/avatars): it is copied and upgraded
to format 2 (the same frames and idle loop), then, alternating the two bundles in each of `--rounds`:
  bytes             the bundle folder (format 1 with its cache/ of I420 frames, as a served avatar has it)
  render            offline render of ~20 s of Piper speech, real-time factor
  ttff              `lipstream serve`: speak -> first speech frame received (full size), p50 over --ttff runs
  patch sessions    sessions_bench.py in patch mode: how many sessions hold 25 fps (of --patch-counts)
  psnr              the same frames rendered from both (speaking mouth), min PSNR in dB
Part 2, a long clip (`--long-seconds`, 1080×1920 sample presenter): prepare time and peak memory (its own
process), bundle size, render speed from it, and a live full-frame session's server memory (VmRSS of the
server, sampled every 0.25 s while it speaks), patch mode too.

    LIPSTREAM_HOME=out/home OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bundle_bench.py \
        --v1 sample_v1 --rounds 2 --long-seconds 120

Writes benchmarks/results/bundle_bench.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import websockets
from bench_common import cpu_model, rss_mib, start_server
from serve_bench import TEXT, ttff_once

from lipstream.avatar.bundle import load_avatar
from lipstream.avatar.upgrade import folder_bytes, upgrade_avatar
from lipstream.edge.onnx_gate import psnr_db
from lipstream.engines.registry import create_engine
from lipstream.paths import avatars_dir
from lipstream.render.compositor import Compositor
from lipstream.render.offline import render_speech_to_mp4
from lipstream.talk.tts import create_tts

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
SCRIPT = " ".join([TEXT] * 4)


def render_factor(name: str, engine, speech, out: Path) -> float:
    """Offline render real-time factor of the avatar (a fresh load each time, as a CLI run)."""
    bundle = load_avatar(name)
    engine.prepare(bundle)
    report = render_speech_to_mp4(bundle, engine, speech, out, persist_codebook=False)
    return round(report.realtime_factor, 2)


def rendered_frames(name: str, engine, ids: np.ndarray) -> list[np.ndarray]:
    """Whole frames with a speaking mouth at the given frames."""
    bundle = load_avatar(name)
    features = np.tile(np.array([[0.6, 0.2, 0.0]], np.float32), (len(ids), 1))
    comp = Compositor(bundle)
    return [comp.compose(int(f), p) for f, p in zip(ids, engine.render(bundle, features, ids), strict=True)]


def patch_sessions(name: str, counts: list[int], seconds: float) -> int:
    """Most sessions (of `counts`) that all hold 25 fps in patch mode, from sessions_bench.py."""
    out = Path(tempfile.mkdtemp()) / "sessions.json"
    cmd = [sys.executable, str(REPO / "benchmarks" / "sessions_bench.py"), "--avatar", name, "--sizes",
           "--streams", "patch", "--counts", *map(str, counts), "--seconds", str(seconds), "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)  # fmt: skip
    rows = json.loads(out.read_text())["streams"]["patch"]["sessions"]
    return max((int(n) for n, row in rows.items() if row["all_hold_25fps"]), default=0)


async def ttff(url: str, name: str) -> float:
    """One speak -> first speech frame, ms."""
    return (await ttff_once(url.replace("http", "ws") + "/ws", name, None))["ttff_ms"]


def sample_side_by_side(args: argparse.Namespace) -> dict:
    """Part 1: the format-1 sample and its upgraded copy, alternating."""
    root = avatars_dir()
    v1, v2 = args.v1, f"{args.v1}_v2"
    shutil.rmtree(root / v2, ignore_errors=True)
    shutil.copytree(root / v1, root / v2, ignore=shutil.ignore_patterns("cache"))
    manifest = json.loads((root / v2 / "manifest.json").read_text())
    manifest["name"] = v2  # a bundle's name is its folder's (the server builds the patch base loop by name)
    (root / v2 / "manifest.json").write_text(json.dumps(manifest, indent=2))
    upgrade = upgrade_avatar(v2, progress=False)
    engine = create_engine("viseme")
    speech = create_tts("piper").synthesize(SCRIPT)
    ids = np.array([0, 50, 120, 199]) % load_avatar(v1).frame_count
    pairs = zip(rendered_frames(v1, engine, ids), rendered_frames(v2, engine, ids), strict=True)
    psnr = min(psnr_db(a, b) for a, b in pairs)
    figures: dict[str, dict[str, list]] = {name: {"render_x": [], "ttff_ms": [], "patch_sessions": []}
                                           for name in (v1, v2)}  # fmt: skip
    out = Path(tempfile.mkdtemp(prefix="bundle-bench-"))
    proc, url, _ = start_server(["--avatars-dir", str(root), "--max-sessions", "16"], REPO)
    try:
        for r in range(args.rounds):
            for name in (v1, v2) if r % 2 == 0 else (v2, v1):
                figures[name]["render_x"].append(render_factor(name, engine, speech, out / f"{name}{r}.mp4"))
                figures[name]["ttff_ms"].extend(
                    round(asyncio.run(ttff(url, name)), 1) for _ in range(args.ttff)
                )
                figures[name]["patch_sessions"].append(patch_sessions(name, args.patch_counts, args.seconds))
                print(f"round {r} {name}: {figures[name]}", flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    result = {"upgrade": {"seconds": round(upgrade.seconds, 1), "line": upgrade.line()},
              "render_psnr_min_db": round(psnr, 2)}  # fmt: skip
    for name, label in ((v1, "format_1"), (v2, "format_2")):
        f = figures[name]
        result[label] = {
            "name": name, "bytes": folder_bytes(root / name),
            "render_x_median": float(np.median(f["render_x"])), "ttff_ms_p50": float(np.median(f["ttff_ms"])),
            "patch_sessions_min": min(f["patch_sessions"]), **f,
        }  # fmt: skip
    a, b = result["format_1"], result["format_2"]
    result["ratios_v2_over_v1"] = {
        "bytes": round(b["bytes"] / a["bytes"], 4),
        "render_x": round(b["render_x_median"] / a["render_x_median"], 3),
        "ttff_ms": round(b["ttff_ms_p50"] / a["ttff_ms_p50"], 3),
        "patch_sessions": round(b["patch_sessions_min"] / max(a["patch_sessions_min"], 1), 3),
    }
    return result


def prepare_long(clip: Path, name: str) -> dict:
    """prepare_avatar in its own process: wall seconds and peak RSS."""
    code = (
        "import resource, time\n"
        "from lipstream.avatar.prepare import prepare_avatar\n"
        "t = time.perf_counter()\n"
        f"b = prepare_avatar({str(clip)!r}, {name!r}, force=True, progress=True)\n"
        "print('RESULT', time.perf_counter() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "
        "b.frame_count, len(b.idle_loop))\n"
    )
    cmd = [sys.executable, "-c", code]
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, cwd=REPO)
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT"))
    seconds, peak_kib, frames, loop = line.split()[1:]
    return {"prepare_s": round(float(seconds), 1), "peak_rss_mib": round(int(peak_kib) / 1024),
            "frames": int(frames), "loop_frames": int(loop)}  # fmt: skip


async def live_memory(url: str, name: str, stream: str, seconds: float, pid: int) -> dict:
    """Server RSS while one session of `name` speaks for `seconds` (sampled every 0.25 s)."""
    from bench_common import play_like_a_player

    from lipstream.server.protocol import Kind

    samples = [rss_mib(pid)]
    hello = {"type": "hello", "version": 1, "avatar": name, "output_width": None, "stream": stream}
    for _ in range(60):  # a patch stream waits for the avatar's base loop export (built on first ask)
        ws = await websockets.connect(url.replace("http", "ws") + "/ws", max_size=None)
        await ws.send(json.dumps(hello))
        ready = json.loads(await ws.recv())
        if not ready.get("patch_pending"):
            break
        await ws.close()
        await asyncio.sleep(2.0)
    await ws.send(json.dumps({"type": "speak", "text": " ".join([TEXT] * 3)}))
    stop = asyncio.Event()

    async def sample() -> None:
        while not stop.is_set():
            samples.append(rss_mib(pid))
            await asyncio.sleep(0.25)

    sampler = asyncio.create_task(sample())
    kinds = (Kind.VIDEO,) if stream == "full" else (Kind.PATCH,)
    played = await play_like_a_player(ws, seconds, kinds)
    stop.set()
    await sampler
    await ws.close()
    return {"stream": stream, "ready": ready.get("type"), "rss_before_mib": round(samples[0]),
            "rss_peak_mib": round(max(samples)), "played": played}  # fmt: skip


def long_clip(args: argparse.Namespace) -> dict:
    """Part 2: a long 1080×1920 clip prepared, rendered and served."""
    from lipstream.avatar.sample import write_sample_video

    name = f"long{int(args.long_seconds)}"
    clip = Path(tempfile.mkdtemp(prefix="bundle-bench-")) / "long.mp4"
    t0 = time.perf_counter()
    write_sample_video(clip, 1080, 1920, args.long_seconds, progress=True)
    result: dict = {"clip_seconds": args.long_seconds, "clip_write_s": round(time.perf_counter() - t0, 1)}
    result.update(prepare_long(clip, name))
    result["prepare_x_clip"] = round(result["prepare_s"] / args.long_seconds, 3)
    result["bytes"] = folder_bytes(avatars_dir() / name)
    result["manifest_idle"] = load_avatar(name).manifest.idle
    engine = create_engine("viseme")
    speech = create_tts("piper").synthesize(SCRIPT)
    result["render_x"] = render_factor(name, engine, speech, clip.with_name("render.mp4"))
    print(f"long clip so far: {result}", flush=True)
    for stream in ("full", "patch"):
        proc, url, _ = start_server(["--avatars-dir", str(avatars_dir()), "--workers", "1"], REPO)
        try:
            measuring = live_memory(url, name, stream, args.seconds, proc.pid)
            result[f"live_{stream}"] = asyncio.run(asyncio.wait_for(measuring, 180))
            print(f"live {stream}: {result[f'live_{stream}']}", flush=True)
        finally:
            proc.terminate()
            proc.wait(10)
    return result


def main() -> None:
    """Run both parts and write the JSON."""
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--v1", default="sample_v1", help="a format-1 bundle to compare with its upgrade")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--ttff", type=int, default=4, help="speak -> first frame runs per bundle per round")
    parser.add_argument("--patch-counts", type=int, nargs="+", default=[4, 6, 8])
    parser.add_argument("--seconds", type=float, default=8.0, help="seconds of each live measurement")
    parser.add_argument("--long-seconds", type=float, default=120.0)
    parser.add_argument("--skip", nargs="*", default=[], choices=["sample", "long"])
    parser.add_argument("--out", type=Path, default=RESULTS / "bundle_bench.json")
    args = parser.parse_args()
    os.environ.setdefault("LIPSTREAM_HOME", str(Path.home() / ".lipstream"))
    result: dict = {"date": time.strftime("%Y-%m-%d"), "cpu_model": cpu_model(), "cpus": os.cpu_count(),
                    "load_average_start": [round(v, 2) for v in os.getloadavg()]}  # fmt: skip
    if "long" not in args.skip:
        result["long"] = long_clip(args)
        print(json.dumps(result["long"], indent=2), flush=True)
    if "sample" not in args.skip:
        result["sample"] = sample_side_by_side(args)
        print(json.dumps(result["sample"], indent=2), flush=True)
    result["load_average_end"] = [round(v, 2) for v in os.getloadavg()]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

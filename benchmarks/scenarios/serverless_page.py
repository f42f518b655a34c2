"""Serverless page (issue 10) in headless Chromium: a 30 s clip on the 1080x1920 sample, served by a plain
static server; main-thread ms per display frame, dropped frames, Play -> first speech frame, engine stages,
and Float -> RGBA packing per 256² frame.

    LIPSTREAM_HOME=out/home .venv/bin/python -m benchmarks serverless_page [--engine musetalk --onnx DIR]
    .venv/bin/python -m benchmarks serverless_musetalk   # --engine musetalk --seconds 6, tiny models:
        per-stage ms on wasm and WebGPU (SwiftShader), engine passes per frame unseeded vs seeded, shapes

Against a user's own Chrome (a real GPU): start it with `google-chrome --remote-debugging-port=9222`, serve an
export (`lipstream export web NAME -o site && python -m http.server -d site 8000`), then
`python -m benchmarks serverless_page --url http://127.0.0.1:8000/ --cdp http://127.0.0.1:9222`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from bench_common import cpu_model  # noqa: E402
from server_harness import run_browser_script  # noqa: E402
from test_edge_musetalk_js import HARNESS  # noqa: E402
from test_edge_web import StaticServer, write_wav  # noqa: E402

from lipstream.edge.web_export import WebExportConfig, export_web  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results" / "edge_bench.json"
PARAGRAPH = (
    "Good evening. Here is the news for the last day of November. The weather will stay mild along the "
    "coast, with some rain in the hills by Thursday. In the city, the new bridge opened to traffic this "
    "morning, two weeks ahead of plan. Markets were calm, and the harbour reported its busiest month of "
    "the year. That is all for now; thank you for watching, and good night."
)


def speech_clip(seconds: float, path: Path) -> np.ndarray:
    """An espeak paragraph repeated to exactly `seconds`, as a 16 kHz WAV."""
    from lipstream.talk.voices.tts import create_tts

    pcm = create_tts("espeak").synthesize(PARAGRAPH).pcm
    n = int(seconds * 16000)
    return write_wav(path, np.resize(pcm, n))


def _stage_means(timing: dict) -> dict:
    """Per-call mean ms of each engine stage (the Worker's StageTimer totals / counts)."""
    return {k: round(v / max(1, timing["count"].get(k, 1)), 3) for k, v in sorted(timing["ms"].items())}


def musetalk_tiny(args: argparse.Namespace, report: dict, work: Path) -> dict:
    """The MuseTalk path with the tiny same-topology models on the small sample avatar (the 1080x1920 sample
    is 11 GB: no copy of it gets latents): export fp32 + fp16 ONNX, prepare latents, export the page
    unseeded, seed the avatar's codebook with the clip, export again, run the page's engine on each."""
    from lipstream.audio.decode import load_audio
    from lipstream.audio.speech import Speech
    from lipstream.avatar.prepare import prepare_avatar
    from lipstream.avatar.sample import write_sample_video
    from lipstream.edge.onnx_export import OnnxExportConfig, export_onnx
    from lipstream.engines.musetalk.topology import write_model_folder
    from lipstream.engines.registry import create_engine
    from lipstream.render.seed import seed_codebook

    clip = work / "presenter.mp4"
    write_sample_video(clip, width=360, height=640, seconds=2.0, fps=25, seed=0)
    avatars = work / "avatars"
    bundle = prepare_avatar(clip, "small", avatars_root=avatars, progress=False)
    models = write_model_folder(work / "models", versions=("1.5",), tiny=True)
    onnx = {}
    for dtype in ("float32", "float16"):
        onnx[dtype] = work / f"onnx-{dtype}"
        export_onnx(OnnxExportConfig(models_dir=models, dtype=dtype, batch=4), onnx[dtype])
    engine = create_engine("musetalk", models_dir=str(models), version="1.5", device="cpu", dtype="float32",
                           batch_size=4)  # fmt: skip
    engine.prepare(bundle)
    pcm = np.asarray(load_audio(work / "clip.wav"), dtype=np.float32).reshape(-1)
    config = WebExportConfig(engine="musetalk", onnx_dirs=tuple(onnx.values()))
    export_web("small", work / "plain", config, avatars)
    seeded = seed_codebook(bundle, engine, [Speech(pcm)])
    export_web("small", work / "seeded", config, avatars)
    report["seed"] = {"entries": seeded.entries, "python_neural_frames": seeded.neural_frames}
    short = pcm[: int(args.webgpu_seconds * 16000)]
    runs = {}
    cases = [("wasm", "plain", pcm), ("wasm", "seeded", pcm), ("webgpu", "plain", short)]
    for backend, site_name, audio in cases:
        site = work / site_name
        (site / "harness.html").write_text(HARNESS)
        audio.astype("<f4").tofile(site / "speech.f32")
        server = StaticServer(site)
        engine_opts = {"backend": backend, "dtype": "float32", "persist": False, "noPixels": True}
        if backend == "webgpu":  # SwiftShader runs the tiny VAE decoder for minutes: VAE on wasm
            engine_opts["graphBackends"] = {"vae_decoder": "wasm"}
        try:
            opts = {"url": server.url.rstrip("/"), "scenario": "engine", "pcm": "/speech.f32"}
            result = run_browser_script("edge_musetalk.mjs", {**opts, "engine": engine_opts}, 900)
        finally:
            server.stop()
        stats = result["stats"]
        frames = len(audio) // 640
        runs[f"{backend}_{site_name}"] = {
            "seconds": round(len(audio) / 16000, 2),
            "frames": frames,
            "ready_ms": round(result["readyMs"]),
            "run_ms": round(result["runMs"]),
            "codebook": result["info"]["codebookSource"],
            "engine_passes_per_frame": round(stats["scheduler"]["neuralFrames"] / frames, 3),
            "scheduler": stats["scheduler"],
            "stage_ms_per_call": _stage_means(stats["timing"]),
            "stage_calls": stats["timing"]["count"],
            "distinct_shapes": stats["distinctShapes"],
        }
        print(json.dumps({f"{backend}_{site_name}": runs[f"{backend}_{site_name}"]}), flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    """Export, serve, play and report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--avatar", default="sample")
    parser.add_argument("--engine", choices=["viseme", "musetalk"], default="viseme")
    parser.add_argument("--onnx", help="--engine musetalk: the `lipstream export onnx` folder")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--url", help="a served export to measure instead of exporting one here")
    parser.add_argument("--cdp", help="DevTools URL of the user's own Chrome (--remote-debugging-port)")
    parser.add_argument("--webgpu", action="store_true", help="headless Chromium with --enable-unsafe-webgpu")
    parser.add_argument(
        "--webgpu-seconds", type=float, default=1.0, help="tiny MuseTalk run: clip length on WebGPU (slow)"
    )
    args = parser.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="edge_bench_"))
    wav = work / "clip.wav"
    speech_clip(args.seconds, wav)
    report: dict = {
        "date": str(date.today()), "cpu": cpu_model(), "load_before": os.getloadavg(),
        "engine": args.engine, "clip_seconds": args.seconds,
    }  # fmt: skip
    if args.engine == "musetalk" and not (args.onnx or args.url):
        report["musetalk_tiny"] = musetalk_tiny(args, report, work)
        report["load_after"] = os.getloadavg()
        out = RESULTS.with_name("edge_bench_musetalk.json")
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report, indent=2))
        return 0
    server = None
    try:
        if args.url:
            url = args.url
        else:
            t0 = time.perf_counter()
            config = WebExportConfig(engine=args.engine, onnx_dirs=tuple(Path(d) for d in args.onnx or ()))
            manifest = export_web(args.avatar, work / "site", config)
            report["export_seconds"] = round(time.perf_counter() - t0, 2)
            report["export_bytes"] = {k: v["bytes"] for k, v in manifest["files"].items()}
            report["size"] = [manifest["width"], manifest["height"]]
            server = StaticServer(work / "site")
            url = server.url
        viewport = {"width": 1280, "height": 1000}
        common = {"url": url, "cdp": args.cdp, "webgpu": args.webgpu, "viewport": viewport}
        timeout = args.seconds * 4 + 240
        play = run_browser_script("edge.mjs", {**common, "scenario": "play", "wav": str(wav)}, timeout)
        pack = run_browser_script("edge.mjs", {**common, "scenario": "pack", "reps": 300}, 120)
    finally:
        if server:
            server.stop()
    frames = int(args.seconds * 25)
    report.update(
        {
            "frames": frames,
            "frames_shown": play["framesShown"],
            "dropped_frames": play["skipped"] + play["late"],
            "skipped": play["skipped"],
            "late": play["late"],
            "display_ticks": play["ticks"],
            "main_ms_p50": play["mainMsP50"],
            "main_ms_p95": play["mainMsP95"],
            "main_ms_max": play["mainMsMax"],
            "phrase_blinks_drawn": play["blinks"],  # their frames read the eyes back from the video
            "play_to_first_frame_ms": play["playToFirstFrameMs"],
            "play_to_first_mouth_ms": play["playToFirstMouthMs"],
            "engine_stages_ms": play["stages"],
            "features_ms_per_push_p50": play["featureMsP50"],
            "pack_ms_p50": pack["packMsP50"],
            "pack_ms_p95": pack["packMsP95"],
            "errors": play["errors"],
            "load_after": os.getloadavg(),
        }
    )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

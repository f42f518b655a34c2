"""Text -> speech in headless Chromium on the serverless page: first audio, Piper's real-time factor on
onnxruntime-web (wasm), export size with the voice. Usage: python -m benchmarks serverless_tts EXPORT_DIR
(EXPORT_DIR from `lipstream export web NAME -o EXPORT_DIR --voice`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from server_harness import run_browser_script  # noqa: E402
from test_edge_web import StaticServer  # noqa: E402

from benchmarks.results import Figure, record  # noqa: E402

TEXTS = [
    "Hello there.",
    "Good evening, and welcome to the show. Tonight we talk about the weather, the markets and the "
    "long road home. Stay with us.",
]


def main(argv: list[str] | None = None) -> int:
    """Speak TEXTS in the page of EXPORT_DIR; print the figures and record the headline ones."""
    args = sys.argv[1:] if argv is None else argv
    asked = args in (["-h"], ["--help"])
    if asked or len(args) != 1 or not (Path(args[0]) / "export.json").exists():
        print("usage: python -m benchmarks serverless_tts EXPORT_DIR  (EXPORT_DIR: a folder made by "
              "`lipstream export web NAME -o EXPORT_DIR --voice`)", file=sys.stdout if asked else sys.stderr)
        return 0 if asked else 2
    folder = Path(args[0])
    server = StaticServer(folder)
    try:
        with tempfile.TemporaryDirectory() as out:
            result = run_browser_script(
                "edge_tts.mjs", {"url": server.url, "scenario": "audio", "texts": TEXTS, "outDir": out}, 300
            )
    finally:
        server.stop()
    manifest = json.loads((folder / "export.json").read_text())
    voice = manifest["tts"]["voice"]["model"]
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    rows = []
    for text, f in zip(TEXTS, result["files"], strict=True):
        seconds = f["samples"] / f["rate"]
        rows.append({"chars": len(text), "sentences": f["sentences"], "audio_s": round(seconds, 2),
                     "first_audio_ms": round(f["firstMs"]), "total_ms": round(f["totalMs"]),
                     "rtf": round(sum(f["synthMs"]) / 1000 / seconds, 3)})  # fmt: skip
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((ln.split(":", 1)[1].strip() for ln in cpu.splitlines() if ln.startswith("Model name")), "?")
    report = {
        "cpu": model, "cores": os.cpu_count(), "load": os.getloadavg(), "threads": result["threads"],
        "rows": rows, "export_bytes": size, "voice_bytes": manifest["files"][voice]["bytes"],
    }  # fmt: skip
    print(json.dumps(report, indent=1))
    figures = [Figure("serverless TTS: first audio, short sentence", rows[0]["first_audio_ms"], "ms"),
               Figure("serverless TTS: Piper real-time factor, wasm", rows[-1]["rtf"], "x (lower is faster)")]
    record("serverless_tts", figures, "python -m benchmarks serverless_tts EXPORT_DIR", report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

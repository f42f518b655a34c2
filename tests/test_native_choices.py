"""Issue 48: the native libraries' instruction sets and threads on the CPU at hand
(lipstream.talk.models.native_choices), as `lipstream doctor` prints them and as model children are started
with them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lipstream.commands.doctor import doctor
from lipstream.talk.models.model_process import ChildCommand, RestartPolicy, SupervisedProcess
from lipstream.talk.models.native_choices import (
    CT2_AVX512,
    SECTION,
    CpuFacts,
    child_env,
    ctranslate2_decision,
    read_cpu,
)

REPO = Path(__file__).resolve().parent.parent
CPUINFO = Path("/proc/cpuinfo")
# an ISA name in a report line, and the /proc/cpuinfo flags it needs
ISA_FLAGS = {"AVX512": CT2_AVX512, "AVX-512F": ("avx512f",), "AVX-512 VNNI": ("avx512_vnni",),
             "AVX-VNNI": ("avx_vnni",), "AMX": ("amx_tile",), "AVX2": ("avx2",), "FMA3": ("fma",),
             "FMA": ("fma",), "F16C": ("f16c",), "BMI2": ("bmi2",),
             "SkylakeX": ("avx512f",), "Cooperlake": ("avx512_bf16",)}  # fmt: skip (OpenBLAS core types)
ZEN3 = CpuFacts("AMD EPYC 7763", "AuthenticAMD", frozenset({"avx", "avx2", "fma"}), 2)
SAPPHIRE = CpuFacts("Intel(R) Xeon(R) Platinum 8480+", "GenuineIntel",
                    frozenset({"avx", "avx2", "fma", *CT2_AVX512, "amx_tile", "amx_int8"}), 2)  # fmt: skip

needs_cpuinfo = pytest.mark.skipif(not CPUINFO.exists(), reason="no /proc/cpuinfo (not Linux)")


def cpuinfo_first(key: str) -> str:
    """The first `key :` value of /proc/cpuinfo, read here without lipstream's parser."""
    for line in CPUINFO.read_text().splitlines():
        if line.split(":")[0].strip() == key:
            return line.split(":", 1)[1].strip()
    return ""


def report_here() -> dict:
    """`python -m lipstream.talk.models.native_choices --json`: the report the doctor shows."""
    done = subprocess.run([sys.executable, "-m", "lipstream.talk.models.native_choices", "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_cpuinfo
def test_the_cpu_is_read_as_proc_cpuinfo_says() -> None:
    cpu = read_cpu()
    assert cpu.model == cpuinfo_first("model name") and cpu.vendor == cpuinfo_first("vendor_id")
    assert cpu.flags == frozenset(cpuinfo_first("flags").split())
    assert 1 <= cpu.cores


@needs_cpuinfo
def test_the_report_here_names_no_instruction_set_this_cpu_lacks() -> None:
    report = report_here()
    flags = set(cpuinfo_first("flags").split())
    assert report["cpu"]["vendor"] == cpuinfo_first("vendor_id")
    by_name = {lib["name"]: lib for lib in report["libraries"]}
    assert set(by_name) == {"ctranslate2", "onnxruntime", "numpy BLAS", "x264 (PyAV)", "llama.cpp"}
    for lib in report["libraries"]:
        assert lib["isa"] != "unknown", lib  # every library said what it runs
        for name, needed in ISA_FLAGS.items():
            if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", lib["isa"]):
                assert set(needed) <= flags, f"{lib['name']} reports {name} on a CPU without {needed}"
    # what CTranslate2 runs is its own choice, or a forced ISA the CPU has, never more
    assert by_name["ctranslate2"]["isa"].split()[0] in ({"AVX2"} if "avx2" in flags else {"AVX", "GENERIC"})
    gemm = "Intel MKL" if cpuinfo_first("vendor_id") == "GenuineIntel" else "oneDNN"
    assert f"int8 GEMM by {gemm}" in by_name["ctranslate2"]["isa"]
    assert "portable" in by_name["llama.cpp"]["isa"] and "NOT portable" not in by_name["llama.cpp"]["isa"]
    assert by_name["numpy BLAS"]["threads"].endswith("1 in model children")


def test_a_forced_isa_the_cpu_lacks_is_cleared_for_model_children() -> None:
    # CTranslate2 would throw "The CPU does not support AVX512" at load: the recogniser would never start
    assert child_env(ZEN3, {"CT2_FORCE_CPU_ISA": "AVX512"}) == {"CT2_FORCE_CPU_ISA": ""}
    assert child_env(ZEN3, {"CT2_FORCE_CPU_ISA": "avx2"}) == {"CT2_FORCE_CPU_ISA": ""}  # no such name
    assert ctranslate2_decision(ZEN3, {"CT2_FORCE_CPU_ISA": "AVX512"}).isa == "AVX2"
    # one the CPU has is the operator's to choose, and nothing is set unasked
    assert child_env(SAPPHIRE, {"CT2_FORCE_CPU_ISA": "AVX512"}) == {}
    assert ctranslate2_decision(SAPPHIRE, {"CT2_FORCE_CPU_ISA": "AVX512"}).isa == "AVX512"
    assert child_env(SAPPHIRE, {}) == {} and child_env(ZEN3, {}) == {}
    assert ctranslate2_decision(SAPPHIRE, {}).isa == "AVX2"  # CTranslate2 never picks AVX-512 itself


def test_mkl_stays_on_intel_and_is_cleared_for_children_elsewhere() -> None:
    def gemm(cpu: CpuFacts, environ: dict[str, str]) -> str:
        return ctranslate2_decision(cpu, environ).gemm

    assert gemm(SAPPHIRE, {}) == "Intel MKL" and gemm(ZEN3, {}) == "oneDNN"
    assert gemm(SAPPHIRE, {"CT2_USE_MKL": "0"}) == "oneDNN"
    assert child_env(SAPPHIRE, {"CT2_USE_MKL": "0"}) == {}
    # MKL's int8 GEMM took 16x oneDNN's time on an AMD EPYC (benchmarks native_isa): not in model children
    assert child_env(ZEN3, {"CT2_USE_MKL": "1"}) == {"CT2_USE_MKL": "0"}
    assert gemm(ZEN3, {"CT2_USE_MKL": "true"}) == "oneDNN" and child_env(ZEN3, {"CT2_USE_MKL": "0"}) == {}


def test_model_children_start_with_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CT2_FORCE_CPU_ISA", "NO_SUCH_ISA")
    code = ("import json, os; print(json.dumps({'ready': True, 'port': 1, "
            "'isa': os.environ.get('CT2_FORCE_CPU_ISA')}), flush=True); import time; time.sleep(60)")
    supervisor = SupervisedProcess(ChildCommand([sys.executable, "-c", code], "test child"),
                                   RestartPolicy(max_failed_starts=1, ready_timeout_seconds=20))  # fmt: skip
    supervisor.start()
    try:
        endpoint = supervisor.wait_ready(20)
        assert endpoint is not None and endpoint.ready["isa"] == ""
    finally:
        supervisor.stop()


def test_doctor_prints_the_section_and_puts_it_in_its_json(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    started = time.perf_counter()
    assert doctor(checks=[]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"{SECTION}:" in out, out
    section = out[out.index(f"{SECTION}:") + 1:]
    assert section[0].startswith(f"  cpu: {read_cpu().model} (")
    for name in ("ctranslate2", "onnxruntime", "numpy BLAS", "x264 (PyAV)", "llama.cpp"):
        assert any(line.startswith(f"  {name} ") for line in section), name
    assert doctor(as_json=True, checks=[]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["native"]["cpu"]["model"] == read_cpu().model
    assert [line.strip() for line in section[: len(report["native"]["lines"])]] == report["native"]["lines"]
    # the report sees the environment as it is, and says what model children get instead
    monkeypatch.setenv("CT2_USE_MKL", "1")
    assert doctor(as_json=True, checks=[]) == 0
    ct2 = json.loads(capsys.readouterr().out)["native"]["libraries"][0]
    assert ct2["name"] == "ctranslate2" and ct2["env"] == child_env(read_cpu(), {"CT2_USE_MKL": "1"})
    assert time.perf_counter() - started < 10


@pytest.mark.slow
def test_ctranslate2_selects_what_the_report_says() -> None:
    """CTranslate2's own log of a model load (CT2_VERBOSE) names the ISA and GEMM library predicted here."""
    code = ("import ctranslate2\nfrom lipstream.talk.hearing.stt import bundled_whisper_path\n"
            "ctranslate2.models.Whisper(str(bundled_whisper_path()), device='cpu', compute_type='int8')\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("CT2_")}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**env, "CT2_VERBOSE": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    cpu = read_cpu()
    choice = ctranslate2_decision(cpu, {})
    isa, gemm = choice.isa, {"Intel MKL": "MKL", "oneDNN": "DNNL"}[choice.gemm]
    assert f"Selected ISA: {isa}" in done.stderr, done.stderr[-2000:]
    assert f"GEMM_S8 backend: {gemm}" in done.stderr, done.stderr[-2000:]

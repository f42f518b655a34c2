"""Issue 19: the installed llama.cpp runs on every x86-64 CPU the project's machines have (AVX2 up to
AVX-512/AMX): built for the x86-64-v3 baseline, never tuned to the build machine's own CPU."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from lipstream.talk.models.llm_llama import PORTABLE_FEATURES, compiled_features

# AVX-512 registers (zmm, opmask k1-k7) and AMX tile instructions, as objdump prints them
BEYOND_BASELINE = re.compile(r"%zmm\d|\{%k[1-7]\}|\btile(?:loadd|stored|zero|release)|\btdpb")


def test_llama_cpp_reports_only_baseline_features() -> None:
    used = {name for name, on in compiled_features().items() if on}
    assert {"AVX2", "FMA", "F16C"} <= used  # the baseline is there (speed)...
    assert used <= PORTABLE_FEATURES, f"built for a specific CPU: {sorted(used - PORTABLE_FEATURES)}"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed")
def test_no_avx512_or_amx_instruction_in_the_llama_cpp_libraries() -> None:
    """The machine code itself: a native build on an AVX-512 machine fills the CPU kernels with zmm."""
    import llama_cpp

    libraries = sorted((Path(llama_cpp.__file__).parent / "lib").glob("*.so*"))
    assert any("ggml-cpu" in lib.name or "ggml" in lib.name for lib in libraries), libraries
    for lib in libraries:
        text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(lib)], capture_output=True,
                              text=True, timeout=300).stdout  # fmt: skip
        hits = BEYOND_BASELINE.findall(text)
        assert not hits, f"{lib.name} uses instructions beyond x86-64-v3: {sorted(set(hits))[:5]}"

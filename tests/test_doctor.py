"""Issue 19: `lipstream doctor`: real checks, one line each, a crash reported as a failed line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from lipstream.commands.doctor import CheckResult, report_exit_code, run_checks
from lipstream.commands.doctor_checks import Check, cpu_info, default_checks

sys.path.insert(0, str(Path(__file__).parent))
import doctor_crash_check  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def test_a_check_that_crashes_natively_is_a_failed_line_and_the_doctor_lives() -> None:
    checks = [
        Check("crashes", doctor_crash_check.crash, "rebuild it"),
        Check("fine", doctor_crash_check.fine, "nothing"),
    ]
    crashed, fine = run_checks(checks)
    assert not crashed.ok and crashed.detail == "crashed (killed by SIGSEGV)"
    assert crashed.line() == "✗ crashes: crashed (killed by SIGSEGV) → rebuild it"
    assert fine.ok and fine.line() == "✓ fine: all good"
    assert report_exit_code([crashed, fine]) == 1


def test_only_required_checks_decide_the_exit_code() -> None:
    optional = CheckResult("chromium", False, "not installed", "apt-get install chromium", False, 0.0)
    required = CheckResult("x264", True, "ok", "", True, 0.0)
    assert report_exit_code([optional, required]) == 0
    assert "(optional)" in optional.line()


def test_cpu_info_reads_model_and_flags(tmp_path: Path) -> None:
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum\nflags\t: fpu avx2 avx512f\n")
    assert cpu_info(cpuinfo) == ("Intel(R) Xeon(R) Platinum", {"fpu", "avx2", "avx512f"})


@pytest.mark.slow
def test_doctor_passes_here_and_reports_every_component() -> None:
    done = subprocess.run([sys.executable, "-m", "lipstream", "doctor", "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    report = json.loads(done.stdout)
    by_name = {c["name"]: c for c in report["checks"]}
    assert set(by_name) == {c.name for c in default_checks()}
    failed = {n: c["detail"] for n, c in by_name.items() if c["required"] and not c["ok"]}
    assert not failed and done.returncode == 0 and report["ok"], failed
    model, _flags = cpu_info()
    assert by_name["cpu"]["detail"].startswith(model)
    assert "tokens/s" in by_name["language model"]["detail"]
    assert "portable build" in by_name["llama.cpp build"]["detail"]
    assert "hello" in by_name["whisper"]["detail"].lower()
    assert by_name["sentence vectors"]["ok"] and "paraphrase" in by_name["sentence vectors"]["detail"]
    assert "W0000" not in done.stderr and "Feedback manager" not in done.stderr

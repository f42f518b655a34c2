"""`lipstream doctor`: runs the checks (lipstream.commands.doctor_checks), each native one in a child
process, and prints one line each with a fix; then the native libraries' instruction sets and threads on
this CPU (lipstream.talk.models.native_choices, also in a child process)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lipstream.commands.doctor_checks import Check, default_checks, knowledge_check, persona_check
from lipstream.native_logs import quiet_native_logs
from lipstream.talk.models.model_process import describe_exit
from lipstream.talk.models.native_choices import SECTION, child_env

CHECK_TIMEOUT_SECONDS = 180.0
NATIVE_TIMEOUT_SECONDS = 60.0


@dataclass(frozen=True)
class CheckResult:
    """One line of the report."""

    name: str
    ok: bool
    detail: str
    fix: str
    required: bool
    seconds: float

    def line(self) -> str:
        """`✓ name: detail` or `✗ name: detail → fix`."""
        if self.ok:
            return f"✓ {self.name}: {self.detail}"
        optional = "" if self.required else " (optional)"
        return f"✗ {self.name}{optional}: {self.detail} → {self.fix}"


def run_in_process(run: Callable[[], str]) -> tuple[bool, str]:
    """Run a check's function here; (ok, detail)."""
    try:
        return True, run()
    except Exception as exc:  # the check's failure is the report's content
        return False, " ".join(str(exc).split())[:400] or type(exc).__name__


def run_isolated(check: Check, timeout: float = CHECK_TIMEOUT_SECONDS) -> tuple[bool, str]:
    """Run a check in a child process: a crash or a hang there is a failed line, not a dead doctor."""
    target = f"{check.run.__module__}:{check.run.__qualname__}"
    argv = [sys.executable, "-m", "lipstream.commands.doctor", target]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=_child_env())
    except subprocess.TimeoutExpired:
        return False, f"no answer within {timeout:.0f} s"
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        try:
            result = json.loads(lines[-1])
            return bool(result["ok"]), str(result["detail"])
        except (ValueError, KeyError, TypeError):
            pass
    return False, f"crashed ({describe_exit(done.returncode, done.stderr.splitlines())})"


def _child_env(native: bool = True) -> dict[str, str]:
    """A check's child imports what we import, from where we import it, with (`native`) the settings the
    model children get on this CPU (lipstream.talk.models.native_choices.child_env)."""
    settings = child_env() if native else {}
    return {**os.environ, **settings, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


def native_report(timeout: float = NATIVE_TIMEOUT_SECONDS) -> dict[str, Any]:
    """The native libraries' report (talk.models.native_choices), read in a child process (it imports every
    native library): its JSON, or {"error": why} when that child crashed or hung. It sees our environment
    as it is, to say what it changes for model children."""
    argv = [sys.executable, "-m", "lipstream.talk.models.native_choices", "--json"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=_child_env(False))
    except subprocess.TimeoutExpired:
        return {"error": f"no answer within {timeout:.0f} s"}
    lines = done.stdout.strip().splitlines()
    if done.returncode == 0 and lines:
        try:
            return dict(json.loads(lines[-1]))
        except (ValueError, TypeError):
            pass
    return {"error": f"crashed ({describe_exit(done.returncode, done.stderr.splitlines())})"}


def native_lines(report: dict[str, Any]) -> list[str]:
    """The report's section: a heading and one indented line per library (one line when it failed)."""
    if "error" in report:
        return [f"✗ {SECTION}: {report['error']}"]
    return [f"{SECTION}:", *(f"  {line}" for line in report.get("lines", []))]


def run_checks(checks: Sequence[Check], on_result=None) -> list[CheckResult]:
    """Run every check in order; `on_result(result)` as each one finishes."""
    results = []
    for check in checks:
        started = time.perf_counter()
        ok, detail = run_isolated(check) if check.isolated else run_in_process(check.run)
        result = CheckResult(check.name, ok, detail, check.fix, check.required, time.perf_counter() - started)
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def report_exit_code(results: Sequence[CheckResult]) -> int:
    """0 when every required check passed, 1 otherwise."""
    return 0 if all(r.ok for r in results if r.required) else 1


def doctor(as_json: bool = False, checks: Sequence[Check] | None = None, native: bool = True) -> int:
    """Run the checks, print one line each (or JSON), then (`native`) the native libraries' section; return
    the exit code (the section never changes it)."""
    checks = default_checks() if checks is None else checks

    def show(result: CheckResult) -> None:
        if not as_json:
            print(result.line(), flush=True)

    results = run_checks(checks, show)
    code = report_exit_code(results)
    report = native_report() if native else None
    if as_json:
        out = {"ok": code == 0, "checks": [asdict(r) for r in results]}
        print(json.dumps(out if report is None else {**out, "native": report}, indent=2))
        return code
    if report is not None:
        print("\n".join(native_lines(report)), flush=True)
    if code:
        print("lipstream doctor: a component the default paths need does not work (✗ above)", flush=True)
    else:
        print("lipstream doctor: everything the default paths need works", flush=True)
    return code


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `doctor`."""
    doctor = subparsers.add_parser(
        "doctor", help="check every component the default paths need, one line each, with a fix"
    )
    doctor.add_argument("--json", action="store_true", help="print the results as JSON")
    doctor.add_argument("--knowledge", type=Path, default=None, metavar="PATH",
                        help="also check this knowledge index (serve --knowledge): documents, chunks, age")
    doctor.add_argument("--persona", type=Path, default=None, metavar="FILE",
                        help="also check this persona file (serve --persona)")
    doctor.set_defaults(func=run_doctor)


def run_doctor(args: argparse.Namespace) -> int:
    """Run the checks; exit 0 when everything required works, 1 otherwise."""
    checks = default_checks()
    if getattr(args, "knowledge", None) is not None:
        checks.append(knowledge_check(args.knowledge))
    if getattr(args, "persona", None) is not None:
        checks.append(persona_check(args.persona))
    return doctor(as_json=args.json, checks=checks)


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m lipstream.commands.doctor MODULE:FUNCTION`: run one check here, print one JSON line."""
    target = (argv if argv is not None else sys.argv[1:])[0]
    module, _, name = target.partition(":")
    run = getattr(importlib.import_module(module), name)
    with quiet_native_logs():
        ok, detail = run_in_process(run)
    print(json.dumps({"ok": ok, "detail": detail}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

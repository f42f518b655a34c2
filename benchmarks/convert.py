"""Seed benchmarks/results/<scenario>.json from the raw JSON a script wrote before the results schema."""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import asdict
from pathlib import Path

from benchmarks.registry import Scenario
from benchmarks.results import REPO, RESULTS_DIR, is_result, result_path, write
from benchmarks.runner import command_for, headline_figures

# Machines a raw JSON does not name (or names as "x86_64 vm"), as docs/benchmarks-history.md states them
DOC_MACHINES = {
    "serve": {"cpu_model": "not recorded", "cores": 2},
    "browser": {"cpu_model": "not recorded", "cores": 2},
    "musetalk_on_cpu": {"cpu_model": "AMD EPYC", "cores": 2},
    "lipsync": {"cpu_model": "AMD EPYC", "cores": 2},
}
# what the history doc says of those runs' machines beyond the pure fields: remarks, for the result's extra
DOC_REMARKS = {
    "musetalk_on_cpu": "avx512_bf16; load average 6.5-9",
    "lipsync": "re-measured 2026-12-01 03:10, quiet",
}


def git_last(path: Path, fmt: str) -> str | None:
    """`git log -1 --format=FMT` of the commit that last changed `path` (None when untracked)."""
    out = subprocess.run(["git", "log", "-1", f"--format={fmt}", "--", str(path)], cwd=REPO,
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    return out or None


def raw_machine(scenario: Scenario, raw: dict) -> dict:
    """The machine as the raw JSON (or the history doc, for runs whose JSON lacks it) names it; a key
    neither holds stays None: nothing is invented."""
    meta = raw.get("meta") if isinstance(raw.get("meta"), dict) else {}
    cpu = raw.get("cpu_model") or raw.get("cpu") or meta.get("device") or raw.get("machine")
    cores = raw.get("cores") or raw.get("cpus")
    if not isinstance(cores, int) and isinstance(raw.get("machine"), str):
        found = re.search(r"(\d+) (?:cpus|CPUs|cores)", raw["machine"])
        cores = int(found.group(1)) if found else None
    if isinstance(cpu, str) and cpu.startswith(("x86_64", "aarch64")):
        cpu = None  # "x86_64 2 cpus": an architecture and a count, not a model
    machine = {"cpu_model": cpu or "not recorded", "cores": cores if isinstance(cores, int) else None,
               "load_start": None, "load_end": None}  # fmt: skip
    if scenario.name in DOC_MACHINES:
        machine.update(DOC_MACHINES[scenario.name])
    return machine


def converted(scenario: Scenario, raw_path: Path) -> dict | None:
    """The results document for `scenario` from its pre-schema raw JSON (None when it holds no headline)."""
    raw = json.loads(raw_path.read_text())
    if not isinstance(raw, dict) or is_result(raw):
        return None
    figures, missing = headline_figures(scenario, raw)
    if not figures:
        return None
    meta = raw.get("meta") if isinstance(raw.get("meta"), dict) else {}
    date = raw.get("date") or meta.get("date")
    extra: dict = {"converted_from": str(raw_path.relative_to(REPO))}
    if not date:  # why: the JSON does not say when; the commit that added it does
        date, extra["date_from"] = git_last(raw_path, "%cI") or "not recorded", "the commit of the raw JSON"
    if raw.get("command"):
        extra["original_command"] = raw["command"]
    if scenario.name in DOC_REMARKS:
        extra["machine_remarks"] = DOC_REMARKS[scenario.name]
    if missing:
        extra["headlines_not_in_raw"] = missing
    return {
        "scenario": scenario.name,
        "command": command_for(scenario, scenario.usage.split()),
        "date": str(date),
        "commit": git_last(raw_path, "%h") or "unknown",
        "machine": raw_machine(scenario, raw),
        "figures": [asdict(f) for f in figures],
        "extra": extra,
    }


def convert_all(scenarios: tuple[Scenario, ...], results_dir: Path = RESULTS_DIR) -> list[Path]:
    """Seed a results file for every scenario with a raw JSON; never overwrite one a run recorded."""
    written = []
    for scenario in scenarios:
        if not scenario.raw or not (results_dir / scenario.raw).exists():
            continue
        target = result_path(scenario.name, results_dir)
        existing = json.loads(target.read_text()) if target.exists() else None
        if is_result(existing) and "converted_from" not in existing.get("extra", {}):
            continue  # measured by a run: the real thing stays
        document = converted(scenario, results_dir / scenario.raw)
        if document:
            written.append(write(document, results_dir))
    return written

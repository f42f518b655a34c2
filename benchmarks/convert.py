"""Seed benchmarks/results/<scenario>.json from the raw JSON a script wrote before the results schema."""

from __future__ import annotations

import json
import subprocess
from dataclasses import asdict
from pathlib import Path

from benchmarks.results import REPO, RESULTS_DIR, is_result, result_path, write
from benchmarks.runner import command_for, headline_figures
from benchmarks.scenarios import Scenario


def git_last(path: Path, fmt: str) -> str | None:
    """`git log -1 --format=FMT` of the commit that last changed `path` (None when untracked)."""
    out = subprocess.run(["git", "log", "-1", f"--format={fmt}", "--", str(path)], cwd=REPO,
                         capture_output=True, text=True).stdout.strip()  # fmt: skip
    return out or None


def raw_machine(raw: dict) -> dict:
    """The machine as the raw JSON names it (nothing invented: a key it lacks stays None)."""
    cpu = raw.get("cpu_model") or raw.get("cpu") or raw.get("machine")
    cores = raw.get("cores") or raw.get("cpus")
    return {"cpu_model": cpu or "not recorded", "cores": cores if isinstance(cores, int) else None,
            "python": raw.get("python")}  # fmt: skip


def converted(scenario: Scenario, raw_path: Path) -> dict | None:
    """The results document for `scenario` from its pre-schema raw JSON (None when it holds no headline)."""
    raw = json.loads(raw_path.read_text())
    if is_result(raw) or not isinstance(raw, dict):
        return None
    figures, missing = headline_figures(scenario, raw)
    if not figures:
        return None
    rel = str(raw_path.relative_to(REPO))
    date = raw.get("date") or git_last(raw_path, "%cI") or "not recorded"
    extra = {"converted_from": rel, "original_command": raw.get("command")} if raw.get("command") else {
        "converted_from": rel}
    if missing:
        extra["headlines_not_in_raw"] = missing
    return {
        "scenario": scenario.name,
        "command": command_for(scenario, []),
        "date": str(date),
        "commit": git_last(raw_path, "%h") or "unknown",
        "machine": raw_machine(raw),
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
        if target.exists() and "converted_from" not in json.loads(target.read_text()).get("extra", {}):
            continue  # measured by a run: the real thing stays
        document = converted(scenario, results_dir / scenario.raw)
        if document:
            written.append(write(document, results_dir))
    return written

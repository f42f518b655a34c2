"""The one results schema: a scenario's headline figures with the machine, date and commit, as JSON."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO / "benchmarks" / "results"


@dataclass(frozen=True)
class Figure:
    """One headline figure: its name, value and unit, and the goal it is held to ("<= 200" or "<= 200 ms")."""

    name: str
    value: float
    unit: str
    goal: str | None = None


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# the load average when this process started (the runner imports this module first): a result's machine
# holds it beside the load at the end
LOAD_AT_START = round(os.getloadavg()[0], 2)


def machine() -> dict:
    """The machine a figure was measured on, as pure fields: CPU model (/proc/cpuinfo), cores, and the
    1-minute load average at the start and at the end of the run; remarks go in the result's `extra`."""
    return {"cpu_model": cpu_model(), "cores": os.cpu_count(), "load_start": LOAD_AT_START,
            "load_end": round(os.getloadavg()[0], 2)}  # fmt: skip


def git_commit(repo: Path = REPO) -> str:
    """This checkout's short commit hash, "+dirty" when it has uncommitted changes ("unknown" outside git)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True,
                             text=True, check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo,
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return sha + ("+dirty" if dirty else "")


def result_path(scenario: str, results_dir: Path = RESULTS_DIR) -> Path:
    """Where a scenario's results JSON lives (ValueError for a name that is not a plain file name)."""
    if not scenario or "/" in scenario or scenario.startswith("."):
        raise ValueError(f"scenario name {scenario!r} must be a plain name like 'serve_ttff'")
    return results_dir / f"{scenario}.json"


def record(
    scenario: str,
    figures: list[Figure],
    command: str,
    extra: dict | None = None,
    results_dir: Path = RESULTS_DIR,
) -> Path:
    """Write benchmarks/results/<scenario>.json: the figures with machine, date, commit and the command."""
    if not figures:
        raise ValueError(f"record({scenario!r}): no figures given; pass at least one Figure")
    for figure in figures:
        if not isinstance(figure, Figure):
            raise TypeError(f"record({scenario!r}): {figure!r} is not a benchmarks.results.Figure")
    document = {
        "scenario": scenario,
        "command": command,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "machine": machine(),
        "figures": [{**asdict(f), "value": float(f.value)} for f in figures],
        "extra": extra or {},
    }
    return write(document, results_dir)


def write(document: dict, results_dir: Path = RESULTS_DIR) -> Path:
    """Write one results document (the schema of `record`) as benchmarks/results/<scenario>.json."""
    path = result_path(document["scenario"], results_dir)
    if path.exists() and not is_result(json.loads(path.read_text())):
        raise ValueError(f"{path} is a script's own raw JSON, not a results file; give the scenario "
                         f"{document['scenario']!r} another name")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
    print(f"recorded {len(document['figures'])} figure(s) in {path}", file=sys.stderr)
    return path


def is_result(data: object) -> bool:
    """Whether a parsed JSON document has this schema (the scripts' own raw JSON does not)."""
    keys = ("scenario", "command", "date", "commit", "machine", "figures")
    return isinstance(data, dict) and all(key in data for key in keys)


def load(path: Path) -> dict:
    """One results JSON, checked to have the schema's keys (ValueError naming the file and the key)."""
    data = json.loads(Path(path).read_text())
    if not is_result(data):
        raise ValueError(f"{path}: not a results file (scenario, command, date, commit, machine, figures); "
                         "write it with benchmarks.results.record")
    return data

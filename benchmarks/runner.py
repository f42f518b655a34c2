"""Run a named scenario: import its module, call `main(argv)`, record its headline figures."""

from __future__ import annotations

import importlib
import inspect
import json
import sys
import time
from pathlib import Path
from types import ModuleType

from benchmarks.registry import Scenario
from benchmarks.results import REPO, RESULTS_DIR, Figure, record

BENCH_DIR = REPO / "benchmarks"
SCENARIOS_DIR = BENCH_DIR / "scenarios"


def ensure_paths() -> None:
    """Put benchmarks/ and the repository root on sys.path: the scripts import the helpers by bare name."""
    for folder in (str(REPO), str(BENCH_DIR)):
        if folder not in sys.path:
            sys.path.insert(0, folder)


def module_path(scenario: Scenario) -> Path:
    """The file of a scenario's module: benchmarks/scenarios/<module>.py (benchmarks/<module>.py for a script
    not moved there yet)."""
    moved = SCENARIOS_DIR / f"{scenario.module}.py"
    return moved if moved.exists() or not (BENCH_DIR / f"{scenario.module}.py").exists() else (
        BENCH_DIR / f"{scenario.module}.py")


def import_name(scenario: Scenario) -> str:
    """The name a scenario's module is imported by: benchmarks.scenarios.<module> (bare at the top)."""
    path = module_path(scenario)
    return f"benchmarks.scenarios.{scenario.module}" if path.parent == SCENARIOS_DIR else scenario.module


def load_module(scenario: Scenario) -> ModuleType:
    """Import a scenario's module (FileNotFoundError when another change has not added it yet)."""
    path = module_path(scenario)
    if not path.exists():
        raise FileNotFoundError(f"scenario {scenario.name!r}: {path.relative_to(REPO)} does not exist "
                                "(yet); `python -m benchmarks list` marks such scenarios as missing")
    ensure_paths()
    return importlib.import_module(import_name(scenario))


def call_main(module: ModuleType, argv: list[str], prog: str | None = None) -> int:
    """Call the module's `main(argv)`; a `main()` without parameters gets `argv` through sys.argv.
    `prog` stands in sys.argv[0] meanwhile, so that usage messages name the command that was typed."""
    main = getattr(module, "main", None)
    if main is None:
        raise AttributeError(f"{module.__file__} has no main(argv); add one to run it by name")
    saved = sys.argv
    sys.argv = [prog or str(module.__file__), *argv]
    try:
        if inspect.signature(main).parameters:
            code = main(argv)
        else:  # why: a script another change has not given main(argv) yet still runs by name
            code = main()
    except SystemExit as stop:  # argparse's --help and usage errors
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        sys.argv = saved
    return int(code or 0)


def raw_output(scenario: Scenario, argv: list[str]) -> Path:
    """Where the script wrote its raw JSON: its --out/--json argument (a file, or a folder) or the default."""
    path = RESULTS_DIR / str(scenario.raw)
    for flag in ("--out", "--json"):
        if flag in argv[:-1]:
            given = Path(argv[argv.index(flag) + 1])
            path = given / path.name if given.is_dir() else given
    return path if path.is_absolute() else REPO / path


def dig(data: object, path: str) -> float:
    """The number at `path` ("a > b > 0": keys, and indices into lists) in a parsed JSON document
    (KeyError naming the path and the step where it stopped)."""
    node = data
    for step in (part.strip() for part in path.split(">")):
        try:
            node = node[int(step)] if isinstance(node, list) else node[step]  # type: ignore[index]
        except (KeyError, IndexError, TypeError, ValueError):
            raise KeyError(f"no {path!r} in the raw JSON (stopped at {step!r})") from None
    if isinstance(node, bool) or not isinstance(node, int | float):
        raise KeyError(f"{path!r} in the raw JSON is {node!r}, not a number")
    return float(node)


def headline_figures(scenario: Scenario, data: object) -> tuple[list[Figure], list[str]]:
    """The scenario's headline figures read from its raw JSON, and a note for each one it does not hold."""
    figures, missing = [], []
    for headline in scenario.headlines:
        try:
            value = dig(data, headline.path) * headline.scale
        except KeyError as error:
            missing.append(f"{headline.name}: {error.args[0]}")
            continue
        figures.append(Figure(headline.name, round(value, 4), headline.unit, headline.goal))
    return figures, missing


def command_for(scenario: Scenario, argv: list[str]) -> str:
    """The command line that reproduces a run."""
    return " ".join(["python -m benchmarks", scenario.name, *argv])


def run(scenario: Scenario, argv: list[str]) -> int:
    """Run a scenario with `argv` after its fixed arguments; record its headline figures when it succeeds."""
    module = load_module(scenario)
    started = time.time()
    code = call_main(module, [*scenario.args, *argv], f"python -m benchmarks {scenario.name}")
    if code != 0 or not scenario.headlines or "--help" in argv or "-h" in argv:
        return code
    if getattr(module, "record", None) is record:  # the script records its own figures
        return code
    path = raw_output(scenario, [*scenario.args, *argv])
    if not path.exists() or path.stat().st_mtime < started:
        print(f"{scenario.name}: no fresh raw JSON at {path}; nothing recorded", file=sys.stderr)
        return 1
    figures, missing = headline_figures(scenario, json.loads(path.read_text()))
    for note in missing:
        print(f"{scenario.name}: headline not in this run's JSON: {note}", file=sys.stderr)
    if figures:
        raw = str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)
        record(scenario.name, figures, command_for(scenario, argv), {"raw": raw})
    return code

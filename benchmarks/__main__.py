"""`python -m benchmarks NAME [options]`: run a named scenario; `list`, `table`, `convert`, `before_after`."""

from __future__ import annotations

import sys

from benchmarks.registry import SCENARIOS, TOOLS, by_name

USAGE = """usage: python -m benchmarks NAME [options]    run a scenario (its script's options: NAME --help)
       python -m benchmarks list                 the scenarios
       python -m benchmarks table                regenerate the table in docs/benchmarks.md
       python -m benchmarks convert              seed results JSON from scripts' pre-schema raw JSON
       python -m benchmarks before_after --before REV [--rounds N] -- NAME [options]"""


def list_scenarios() -> int:
    """Print every scenario with its module and description; a module not present is marked missing."""
    from benchmarks.runner import REPO, module_path

    width = max(len(s.name) for s in SCENARIOS)
    for scenario in SCENARIOS:
        path = module_path(scenario)
        mark = "" if path.exists() else f"  [missing: {path.relative_to(REPO)}]"
        needs = f"\n{'':<{width}}    e.g. {scenario.usage}" if scenario.usage else ""
        print(f"{scenario.name:<{width}}  {scenario.description}{mark}{needs}")
    print("\ntools: " + "; ".join(f"{name}: {what}" for name, what in TOOLS.items()))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Dispatch: a tool name, or a scenario name followed by its script's options."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name == "list":
        return list_scenarios()
    if name == "table":
        from benchmarks.table import write_table

        print(f"docs/benchmarks.md: {write_table()} figures")
        return 0
    if name == "convert":
        from benchmarks.convert import convert_all

        print(f"{len(convert_all(SCENARIOS))} results file(s) seeded from raw JSON")
        return 0
    if name == "before_after":
        from benchmarks.before_after import main as before_after

        return before_after(rest)
    try:
        scenario = by_name(name)
    except KeyError as error:
        print(error.args[0], file=sys.stderr)
        return 2
    from benchmarks.runner import run

    return run(scenario, rest)


if __name__ == "__main__":
    raise SystemExit(main())

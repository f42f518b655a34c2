"""Run one benchmark on two trees of this repository, alternating, and print every figure side by side.

Run: .venv/bin/python -m benchmarks before_after --before REV [--rounds 2] -- NAME ARGS...
(NAME: a scenario of `python -m benchmarks list`, or a script under benchmarks/, e.g. sessions_bench.py)

The "before" tree is a git worktree of REV (made once under /tmp, with this checkout's npm folders linked);
"after" is this checkout. Each round runs the benchmark in both trees, in alternating order, with the same
virtualenv and arguments; the benchmark's `--out` JSON of each run is kept. The numbers of the two trees
are then matched by their path in the JSON and printed with their ratio (after / before), median over the
rounds: on a noisy machine only figures measured side by side in one run are comparable.
Writes benchmarks/results/before_after_<bench>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a file: `benchmarks` is a package at the repository root (appended:
    sys.path.append(str(REPO))  # a PYTHONPATH naming another tree keeps its lipstream first)

from benchmarks.results import cpu_model  # noqa: E402
from benchmarks.scenarios import by_name  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
NPM_FOLDERS = ("tests/browser/node_modules", "lipstream/web/edge/musetalk/node_modules",
               "lipstream/web/edge/tts/node_modules")  # fmt: skip


def before_tree(rev: str) -> Path:
    """A worktree of `rev` (made once), sharing this checkout's npm folders."""
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.strip()  # fmt: skip
    tree = Path("/tmp") / f"lipstream-before-{sha}"
    if not tree.exists():
        subprocess.run(["git", "worktree", "add", "--detach", "-f", str(tree), sha], cwd=REPO, check=True)
    for folder in NPM_FOLDERS:
        link, source = tree / folder, REPO / folder
        if source.exists() and not link.exists():
            link.symlink_to(source)
    return tree


def script_of(bench: str) -> tuple[str, list[str]]:
    """A scenario name or a script file name: the script under benchmarks/ and its leading arguments."""
    if bench.endswith(".py"):
        return bench, []
    scenario = by_name(bench)
    return f"{scenario.module}.py", list(scenario.args)


def run_once(tree: Path, bench: str, args: list[str], out: Path, script_tree: Path | None = None) -> dict:
    """Run the benchmark script of `tree` (or of `script_tree`) with the lipstream of `tree`; its JSON."""
    script_tree = script_tree or tree
    if not (script_tree / "benchmarks" / bench).exists():
        raise SystemExit(f"{tree} has no benchmarks/{bench} (renamed since?); pass the script's old name, "
                         "e.g. edge_bench.py, instead of the scenario")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [sys.executable, str(script_tree / "benchmarks" / bench), *args, "--out", str(out)]
    started = time.monotonic()
    subprocess.run(cmd, cwd=tree, env=env, check=True)
    print(f"  {tree.name}: {time.monotonic() - started:.0f} s", flush=True)
    return json.loads(out.read_text())


def numbers(data, path: str = "") -> dict[str, float]:
    """Every number in a JSON document, by its path (lists by index, dicts by key)."""
    if isinstance(data, bool):
        return {}
    if isinstance(data, int | float):
        return {path: float(data)}
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else []
    found: dict[str, float] = {}
    for key, value in items:
        found.update(numbers(value, f"{path}/{key}"))
    return found


def compare(before: list[dict], after: list[dict]) -> list[dict]:
    """Figures found in every run of both trees: medians and after/before."""
    b_runs, a_runs = [numbers(r) for r in before], [numbers(r) for r in after]
    common = set.intersection(*(set(r) for r in b_runs + a_runs))
    rows = []
    for key in sorted(common):
        b = statistics.median(r[key] for r in b_runs)
        a = statistics.median(r[key] for r in a_runs)
        rows.append({"figure": key, "before": b, "after": a, "ratio": (a / b) if b else None})
    return rows


def main(argv: list[str] | None = None) -> int:
    """Alternate the two trees, then print and write the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision of the before tree")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--after-arg", action="append", default=[],
        help="an argument for the after tree's run only (an option the before tree's script lacks)",
    )
    parser.add_argument(
        "--script-from-after", action="store_true",
        help="run this checkout's script in both trees (each with its own lipstream): the same questions and "
        "options for both, where the script measures the lipstream it imports (conversation_bench.py)",
    )
    parser.add_argument("bench", help="a scenario (python -m benchmarks list) or a script: sessions_bench.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments (no --out)")
    opts = parser.parse_args(argv)
    script, leading = script_of(opts.bench)
    args = leading + [a for a in opts.args if a != "--"]
    trees = {"before": before_tree(opts.before), "after": REPO}
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    scratch = Path("/tmp") / f"before_after_{os.getpid()}"
    scratch.mkdir(exist_ok=True)
    for round_ in range(opts.rounds):
        order = ["before", "after"] if round_ % 2 == 0 else ["after", "before"]
        print(f"round {round_ + 1}/{opts.rounds}: {' then '.join(order)}", flush=True)
        for name in order:
            extra = opts.after_arg if name == "after" else []
            out = scratch / f"{name}{round_}.json"
            script_tree = REPO if opts.script_from_after else None
            runs[name].append(run_once(trees[name], script, args + extra, out, script_tree))
    rows = compare(runs["before"], runs["after"])
    print(f"\n{'figure':60s} {'before':>12s} {'after':>12s} {'after/before':>12s}")
    for row in rows:
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.3f}"
        print(f"{row['figure'][:60]:60s} {row['before']:12.4g} {row['after']:12.4g} {ratio:>12s}")
    result = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": cpu_model(),
        "before": opts.before,
        "after": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                text=True).stdout.strip(),  # fmt: skip
        "bench": opts.bench,
        "args": args,
        "after_args": opts.after_arg,
        "rounds": opts.rounds,
        "rows": rows,
        "runs": runs,
    }
    out = RESULTS / f"before_after_{Path(opts.bench).stem}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

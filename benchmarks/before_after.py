"""Run one benchmark on two trees of this repository, alternating, and print every figure side by side.

Run: .venv/bin/python -m benchmarks before_after --before REV [--rounds 2] -- NAME ARGS...
(NAME: a scenario of `python -m benchmarks list`, or a script's file name, e.g. sessions.py or an older
tree's sessions_bench.py)

The "before" tree is a git worktree of REV (made once under /tmp, with this checkout's npm folders linked);
"after" is this checkout. Each round runs the benchmark in both trees, in alternating order, with the same
virtualenv and arguments; the benchmark's `--out` JSON of each run is kept. The numbers of the two trees
are then matched by their path in the JSON and printed with their ratio (after / before), median over the
rounds: on a noisy machine only figures measured side by side in one run are comparable. A text whose key ends
in "digest" (a hash of what was drawn) is compared too: the same in every run of both trees, or not.
A scenario marked `same_script` in the registry (it measures the lipstream it imports) runs this checkout's
script on both trees, as --script-from-after does.
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

from benchmarks.registry import by_name  # noqa: E402
from benchmarks.results import cpu_model  # noqa: E402

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


# runs a scenario's module of one tree (SCRIPT_TREE) with the lipstream of another (TREE), as `python -m`
# would: argv = SCRIPT_TREE TREE MODULE ARGS...; sys.argv[0] becomes the module's file
LAUNCH = ("import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); import benchmarks.scenarios; "
          "sys.path.insert(0, sys.argv.pop(1)); runpy.run_module(sys.argv.pop(1), run_name='__main__', "
          "alter_sys=True)")  # fmt: skip


def former_script(tree: Path, name: str) -> Path:
    """A scenario's script in a tree from before benchmarks/scenarios/: its own registry names the module."""
    code = "import sys; from benchmarks.scenarios import by_name; print(by_name(sys.argv[1]).module)"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    module = subprocess.run([sys.executable, "-c", code, name], cwd=tree, env=env, capture_output=True,
                            text=True, check=False).stdout.strip()  # fmt: skip
    return tree / "benchmarks" / f"{module}.py"


def command_in(tree: Path, bench: str, script_tree: Path) -> list[str]:
    """The command that runs `bench` (a scenario, or a script's file name) from `script_tree` with the
    lipstream of `tree`: the scenario's module (benchmarks/scenarios/), or a file of an older layout."""
    if bench.endswith(".py"):
        for folder in (script_tree / "benchmarks" / "scenarios", script_tree / "benchmarks"):
            if (folder / bench).exists():
                return [sys.executable, str(folder / bench)]
        raise SystemExit(f"{script_tree} has no benchmarks/{bench} nor benchmarks/scenarios/{bench}")
    module = by_name(bench).module
    if (script_tree / "benchmarks" / "scenarios" / f"{module}.py").exists():
        return [sys.executable, "-c", LAUNCH, str(script_tree), str(tree), f"benchmarks.scenarios.{module}"]
    script = former_script(script_tree, bench)
    if not script.exists():
        raise SystemExit(f"{script_tree} has no script for {bench!r} (renamed since?); pass the script's old "
                         "file name, e.g. edge_bench.py, instead of the scenario")
    return [sys.executable, str(script)]


def run_once(tree: Path, bench: str, args: list[str], out: Path, script_tree: Path | None = None) -> dict:
    """Run the benchmark of `tree` (or of `script_tree`) with the lipstream of `tree`; its JSON."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = [*command_in(tree, bench, script_tree or tree), *args, "--out", str(out)]
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


def digests(data, path: str = "") -> dict[str, str]:
    """Every text in a JSON document whose key ends in "digest", by its path."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else []
    found: dict[str, str] = {}
    for key, value in items:
        if isinstance(value, str) and str(key).endswith("digest"):
            found[f"{path}/{key}"] = value
        else:
            found.update(digests(value, f"{path}/{key}"))
    return found


def same_digests(before: list[dict], after: list[dict]) -> dict[str, bool]:
    """For each digest in every run of both trees: whether all runs hold the same one."""
    runs = [digests(r) for r in before + after]
    common = set.intersection(*(set(r) for r in runs)) if runs else set()
    return {key: len({r[key] for r in runs}) == 1 for key in sorted(common)}


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
        "options for both, where the script measures the lipstream it imports (conversation.py)",
    )
    parser.add_argument("bench", help="a scenario (python -m benchmarks list) or a script: sessions.py")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its arguments (no --out)")
    opts = parser.parse_args(argv)
    scenario = None if opts.bench.endswith(".py") else by_name(opts.bench)
    leading = list(scenario.args) if scenario else []
    same_script = opts.script_from_after or bool(scenario and scenario.same_script)
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
            script_tree = REPO if same_script else None
            runs[name].append(run_once(trees[name], opts.bench, args + extra, out, script_tree))
    rows = compare(runs["before"], runs["after"])
    print(f"\n{'figure':60s} {'before':>12s} {'after':>12s} {'after/before':>12s}")
    for row in rows:
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.3f}"
        print(f"{row['figure'][:60]:60s} {row['before']:12.4g} {row['after']:12.4g} {ratio:>12s}")
    same = same_digests(runs["before"], runs["after"])
    for key, equal in same.items():
        print(f"{key[:60]:60s} {'the same in both trees' if equal else 'DIFFERENT'}")
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
        "same_digests": same,
        "runs": runs,
    }
    out = RESULTS / f"before_after_{Path(opts.bench).stem}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

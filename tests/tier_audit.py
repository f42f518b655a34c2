"""Which tests start a browser or a server process without the mark that keeps them out of `make check`.

Read from the test sources (no import, no collection), so the check stays in the fast tier: a test "uses" a
kind when its body, a module-level helper it calls, or a fixture it requests (its own module's, or one of
conftest.py, server_harness.py, fixtures_*.py) names one of that kind's launchers.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

# the helpers every module starts these through (tests/server_harness.py, tests/fake_llm_server.py)
SERVER_LAUNCHERS = frozenset({"ServerProcess", "FakeLLMProcess"})
BROWSER_LAUNCHERS = frozenset({"run_browser_script", "launchChromium", "connectOverCDP"})
SHARED_FIXTURE_MODULES = ("conftest.py", "server_harness.py", "fixtures_*.py", "pipecat/conftest.py")
CHROMIUM_IN_MJS = re.compile(r"launchChromium\(|chromium\.launch\(|connectOverCDP\(")


@dataclass(frozen=True)
class Violation:
    """A test that uses a kind (`browser`, `slow`) without carrying its mark."""

    path: str
    test: str
    mark: str

    def __str__(self) -> str:
        return f"{self.path}::{self.test} needs pytest.mark.{self.mark}"


@dataclass
class Launchers:
    """What starts each kind: names in code and, for the browser, the driver scripts' file names."""

    names: dict[str, frozenset[str]]
    scripts: dict[str, frozenset[str]] = field(default_factory=dict)


def launchers(tests_dir: Path) -> Launchers:
    """The launchers, with every tests/browser/*.mjs that starts Chromium counted as a browser launcher."""
    chromium_scripts = frozenset(
        p.name for p in (tests_dir / "browser").glob("*.mjs") if CHROMIUM_IN_MJS.search(p.read_text())
    )
    return Launchers(
        names={"browser": BROWSER_LAUNCHERS, "slow": SERVER_LAUNCHERS},
        scripts={"browser": chromium_scripts, "slow": frozenset()},
    )


def _marks_in(node: ast.AST) -> set[str]:
    """The `pytest.mark.NAME` names written in an expression (a decorator, a pytestmark value)."""
    return {
        sub.attr
        for sub in ast.walk(node)
        if isinstance(sub, ast.Attribute)
        and isinstance(sub.value, ast.Attribute)
        and sub.value.attr == "mark"
    }


def _is_fixture(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any("fixture" in ast.unparse(d) for d in fn.decorator_list)


def _direct_kinds(words: set[str], found: Launchers) -> set[str]:
    """The kinds whose launcher is among a function's names and strings."""
    return {
        kind
        for kind, names in found.names.items()
        if words & names or any(w.endswith(script) for w in words for script in found.scripts[kind])
    }


def _words_and_calls(fn: ast.AST) -> tuple[set[str], set[str]]:
    """The names, attributes and strings a function's body holds, and the plain names it calls (one walk)."""
    words, calls = set(), set()
    for sub in ast.walk(fn):
        if isinstance(sub, ast.Name):
            words.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            words.add(sub.attr)
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            words.add(sub.value)
        elif isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name):
            calls.add(sub.func.id)
    return words, calls


def _functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, set[str]]]:
    """Module-level functions and Test* class methods: (qualified name, node, class marks)."""
    out = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            out.append((node.name, node, set()))
        elif isinstance(node, ast.ClassDef):
            class_marks = set().union(*(_marks_in(d) for d in node.decorator_list))
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out.append((f"{node.name}::{item.name}", item, class_marks))
    return out


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    return {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}


def kinds_by_function(
    tree: ast.Module, found: Launchers, fixtures: dict[str, set[str]]
) -> dict[str, set[str]]:
    """Each function's kinds, through the helpers it calls and the fixtures it requests, to a fixed point;
    module fixtures found are added to `fixtures`."""
    funcs = _functions(tree)
    walked = {name: _words_and_calls(fn) for name, fn, _ in funcs}  # once: the walk is the cost
    kinds = {name: _direct_kinds(walked[name][0], found) for name, _, _ in funcs}
    edges = {name: walked[name][1] | _params(fn) for name, fn, _ in funcs}
    defines = {name: fn.name for name, fn, _ in funcs if _is_fixture(fn)}
    changed = True
    while changed:
        changed = False
        for name, _, _ in funcs:
            reached = set(kinds[name])
            for callee in edges[name]:
                reached |= kinds.get(callee, set()) | fixtures.get(callee, set())
            if reached != kinds[name]:
                kinds[name], changed = reached, True
            fixture = defines.get(name)
            if fixture and not fixtures.get(fixture, set()) >= reached:
                fixtures[fixture] = fixtures.get(fixture, set()) | reached
                changed = True
    return kinds


def _module_marks(tree: ast.Module) -> set[str]:
    marks: set[str] = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
            marks |= _marks_in(node.value)
    return marks


def shared_fixtures(tests_dir: Path, found: Launchers) -> dict[str, set[str]]:
    """The kinds of the fixtures conftest.py, server_harness.py and fixtures_*.py provide to every module."""
    fixtures: dict[str, set[str]] = {}
    paths = sorted({p for pattern in SHARED_FIXTURE_MODULES for p in tests_dir.glob(pattern)})
    for _ in range(2):  # a shared fixture may request one defined in another shared module
        for path in paths:
            kinds_by_function(ast.parse(path.read_text()), found, fixtures)
    return fixtures


def violations_in(source: str, path: str, found: Launchers, shared: dict[str, set[str]]) -> list[Violation]:
    """The tests of one module's source that use a kind without its mark (module, class or function)."""
    tree = ast.parse(source)
    fixtures = {name: set(kinds) for name, kinds in shared.items()}
    kinds = kinds_by_function(tree, found, fixtures)
    module_marks = _module_marks(tree)
    out = []
    for name, fn, class_marks in _functions(tree):
        if not fn.name.startswith("test") or _is_fixture(fn):
            continue
        marks = module_marks | class_marks | set().union(*(_marks_in(d) for d in fn.decorator_list))
        out.extend(Violation(path, name, kind) for kind in sorted(kinds[name] - marks))
    return out


def audit(tests_dir: Path) -> list[Violation]:
    """Every violation in the test modules under `tests_dir`."""
    found = launchers(tests_dir)
    shared = shared_fixtures(tests_dir, found)
    out = []
    for path in sorted(tests_dir.rglob("test_*.py")):
        # test_tiers.py's examples name launchers on purpose
        if "node_modules" in path.parts or path.name == "test_tiers.py":
            continue
        out.extend(violations_in(path.read_text(), str(path.relative_to(tests_dir)), found, shared))
    return out

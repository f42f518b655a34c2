"""The rooms keep their floors (docs/architecture.md): a room imports only rooms on lower floors, never one on
its own floor or above, at any depth (imports inside functions too); and no module is over 500 lines."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "lipstream"

# floor of every room: folders, and the top-level modules (which are rooms of their own)
FLOORS: dict[str, int] = {
    "errors": 0, "files": 0, "paths": 0, "threads": 0, "native_logs": 0, "heap": 0,
    "audio": 1,
    "media": 2,
    "avatar": 3,
    "engines": 4,
    "render": 5, "talk": 5, "evaluation": 5,
    "edge": 6, "integrations": 6,
    "server": 7,
    "commands": 8, "cli": 8, "__main__": 8, "__init__": 8, "session": 8,
}  # fmt: skip
ROOF = 8
EXCEPTIONS: dict[str, set[str]] = {}  # module path -> rooms it may import against the floors (none today)
MAX_LINES = 500  # a module that grows past this is split by job (docs/architecture.md)
OVERSIZE: dict[str, int] = {}  # module path -> lines it may have until it is split (none today)


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.level > 0:
            names.add("<relative import>")
    return names


def room_of(path: Path) -> str:
    """The room a module belongs to: its first folder under lipstream/, or its own name at the top."""
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else Path(parts[0]).stem


def target_room(module: str) -> str | None:
    """The lipstream room an imported module name is in (None: not lipstream)."""
    if module == "lipstream":
        return "errors"  # `from lipstream import __version__`: the package's own ground floor
    if not module.startswith("lipstream."):
        return None
    return module.split(".")[1]


def test_every_room_has_a_floor() -> None:
    rooms = {room_of(path) for path in PACKAGE.rglob("*.py")}
    missing = sorted(rooms - set(FLOORS))
    assert not missing, f"rooms without a floor in docs/architecture.md: {missing}"


def test_no_room_imports_its_own_floor_or_above() -> None:
    offenders: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        room = room_of(path)
        rel = str(path.relative_to(PACKAGE))
        bad = []
        for module in imported_modules(path):
            if module == "<relative import>":
                bad.append("a relative import (write lipstream.… so the floors can be checked)")
                continue
            target = target_room(module)
            if target is None or target == room or target in EXCEPTIONS.get(rel, set()):
                continue
            if FLOORS[room] == ROOF:
                if FLOORS.get(target, ROOF) == ROOF and target not in ("commands", "session", "cli"):
                    bad.append(module)  # the roof may use every room, and its own command layer
                continue
            if FLOORS.get(target, ROOF) >= FLOORS[room]:
                bad.append(module)
        if bad:
            offenders[rel] = sorted(bad)
    assert not offenders, offenders


def test_the_floor_test_catches_a_wrong_arrow(tmp_path: Path) -> None:
    """The checker itself: an upward import inside a function is found."""
    module = tmp_path / "probe.py"
    module.write_text("def f():\n    from lipstream.render.session import RenderSession\n    return 1\n")
    assert "lipstream.render.session" in imported_modules(module)
    assert FLOORS[target_room("lipstream.render.session")] >= FLOORS["talk"]


def test_plain_server_modules_never_import_ray() -> None:
    """Only lipstream/server/ray_serve.py may import Ray (and only under `serve --ray`)."""

    def uses_ray(path: Path) -> bool:
        return any(m == "ray" or m.startswith("ray.") for m in imported_modules(path))

    offenders = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "ray_serve.py" and uses_ray(path)
    ]
    assert not offenders


def module_lines() -> dict[str, int]:
    """Lines of every module in the package, by path under lipstream/."""
    return {str(p.relative_to(PACKAGE)): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}


def test_no_module_is_over_500_lines() -> None:
    lines = module_lines()
    over = {rel: n for rel, n in sorted(lines.items()) if n > OVERSIZE.get(rel, MAX_LINES)}
    assert not over, f"modules over {MAX_LINES} lines (split them by job): {over}"
    # an allowance ends with the split: it is removed once its module is back under the limit
    stale = sorted(rel for rel in OVERSIZE if lines.get(rel, 0) <= MAX_LINES)
    assert not stale, f"these modules are {MAX_LINES} lines or fewer now; drop them from OVERSIZE: {stale}"


ROOT = PACKAGE.parent
# benchmarks/ and tests/ keep the cap too; a file here may be longer until it is split (none today)
OVERSIZE_OUTSIDE: dict[str, int] = {}


def test_no_benchmark_or_test_is_over_500_lines() -> None:
    lines = {str(path.relative_to(ROOT)): len(path.read_text().splitlines())
             for folder in ("benchmarks", "tests") for path in (ROOT / folder).rglob("*.py")
             if "node_modules" not in path.parts}  # fmt: skip
    over = {rel: n for rel, n in sorted(lines.items()) if n > OVERSIZE_OUTSIDE.get(rel, MAX_LINES)}
    assert not over, f"files over {MAX_LINES} lines (split them by job): {over}"
    stale = sorted(rel for rel in OVERSIZE_OUTSIDE if lines.get(rel, 0) <= MAX_LINES)
    assert not stale, f"{MAX_LINES} lines or fewer now; drop them from OVERSIZE_OUTSIDE: {stale}"

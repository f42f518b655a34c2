"""The rooms keep their one-way arrows (docs: ARCHITECTURE "Rooms"): preparation (avatar/) never imports the
live path (render/, engines/, server/); commands that combine rooms live in lipstream/commands/."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "lipstream"


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (lazy imports inside functions too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_avatar_room_does_not_import_the_live_path() -> None:
    forbidden = ("lipstream.render", "lipstream.engines", "lipstream.server", "lipstream.commands")
    offenders = {
        str(path.relative_to(PACKAGE)): sorted(m for m in imported_modules(path) if m.startswith(forbidden))
        for path in sorted((PACKAGE / "avatar").rglob("*.py"))
    }
    assert not {k: v for k, v in offenders.items() if v}


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

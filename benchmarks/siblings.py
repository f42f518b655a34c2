"""A scenario's module loaded from its file, for a worker that runs as a file in another tree's `lipstream`:
there `benchmarks` may be the older tree's package, and benchmarks/scenarios/ stays off sys.path (its
livekit.py would hide the LiveKit package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCENARIOS_DIR = Path(__file__).resolve().parent / "scenarios"


def scenario_module(name: str) -> ModuleType:
    """benchmarks/scenarios/<name>.py of this checkout, imported as `<name>_scenario` (once)."""
    key = f"{name}_scenario"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, SCENARIOS_DIR / f"{name}.py")
        module = sys.modules[key] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return sys.modules[key]

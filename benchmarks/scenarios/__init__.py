"""The scenarios' scripts, one a scenario, each named after it (`python -m benchmarks list`); the helpers they
share (bench_common, results) are in benchmarks/, imported by bare name: importing this package puts that
folder on sys.path (appended, so that a before/after run's PYTHONPATH keeps its own lipstream first)."""

import sys
from pathlib import Path

_HELPERS = str(Path(__file__).resolve().parents[1])  # benchmarks/
if _HELPERS not in sys.path:
    sys.path.append(_HELPERS)

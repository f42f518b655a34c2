"""The Pipecat tests need pipecat-ai (the `pipecat` extra, in .venv after `make setup`); without it they are
not collected."""

from __future__ import annotations

import importlib.util


def _pipecat_installed() -> bool:
    # pytest puts tests/ on sys.path, where this very folder passes for a namespace package named pipecat
    spec = importlib.util.find_spec("pipecat")
    return spec is not None and spec.origin is not None


# an install without the `pipecat` extra (a serving image, say) still runs the rest of the suite
collect_ignore_glob = [] if _pipecat_installed() else ["test_*.py"]

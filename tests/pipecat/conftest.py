"""The Pipecat tests run only in the Pipecat venv (`make test-pipecat`); elsewhere they are not collected."""

from __future__ import annotations

import importlib.util


def _pipecat_installed() -> bool:
    # pytest puts tests/ on sys.path, where this very folder passes for a namespace package named pipecat
    spec = importlib.util.find_spec("pipecat")
    return spec is not None and spec.origin is not None


# pipecat-ai and face tracking cannot share an environment (protobuf), so the main venv has no pipecat
collect_ignore_glob = [] if _pipecat_installed() else ["test_*.py"]

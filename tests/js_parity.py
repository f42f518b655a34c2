"""Running the Node parity helpers of tests/node (pure ES modules of the page, no browser)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

NODE_DIR = Path(__file__).parent / "node"


def run_node(script: str, request: dict[str, Any], timeout: float = 60.0) -> Any:
    """Run tests/node/`script` with `request` as JSON on stdin; its last stdout line, parsed."""
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    done = subprocess.run(
        [node, str(NODE_DIR / script)], input=json.dumps(request), capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines, f"no output from {script}: {done.stderr[-2000:]}"
    return json.loads(lines[-1])

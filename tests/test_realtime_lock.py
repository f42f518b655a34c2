"""The realtime lock (tests/fixtures_realtime.py) under two real xdist workers: a `realtime` test's call runs
with nothing beside it, and a `realtime` test skipped in its setup does not keep the lock that the one before
kept for it (the run would hang)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two pytest workers start (~5 s)

TESTS = Path(__file__).resolve().parent

TIMED = '''
import json, os, time
from pathlib import Path
import pytest

LOG = Path(os.environ["RT_LOG"])

def _mark(name, what):
    with LOG.open("a") as f:
        f.write(json.dumps([name, what, time.monotonic()]) + "\\n")

@pytest.fixture
def skipped():
    pytest.skip("its fixture is not there")

@pytest.mark.realtime
def test_timed_one():
    _mark("timed_one", "start"); time.sleep(0.6); _mark("timed_one", "end")

@pytest.mark.realtime
def test_timed_two(skipped):
    pass

def test_after():
    _mark("after", "start"); time.sleep(0.2); _mark("after", "end")
'''

OTHERS = '''
import json, os, time
from pathlib import Path

LOG = Path(os.environ["RT_LOG"])

def _busy(name):
    with LOG.open("a") as f:
        f.write(json.dumps([name, "start", time.monotonic()]) + "\\n")
    time.sleep(0.3)
    with LOG.open("a") as f:
        f.write(json.dumps([name, "end", time.monotonic()]) + "\\n")

def test_o1(): _busy("o1")
def test_o2(): _busy("o2")
def test_o3(): _busy("o3")
def test_o4(): _busy("o4")
def test_o5(): _busy("o5")
'''


def test_a_realtime_call_runs_alone_and_a_skipped_one_gives_the_lock_back(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    realtime: checks a clock\n")
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\npytest_plugins = ['fixtures_realtime']\n"
    )
    (tmp_path / "test_a_timed.py").write_text(TIMED)
    (tmp_path / "test_b_others.py").write_text(OTHERS)
    log = tmp_path / "log.jsonl"
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider"],
        cwd=tmp_path, env={**os.environ, "RT_LOG": str(log), "PYTEST_ADDOPTS": ""},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    assert "7 passed, 1 skipped" in run.stdout, run.stdout[-1000:]
    marks = [json.loads(line) for line in log.read_text().splitlines()]
    spans = {}
    for name, what, at in marks:
        spans.setdefault(name, {})[what] = at
    timed = spans["timed_one"]
    for name, span in spans.items():  # nothing else ran while the realtime call did
        if name != "timed_one":
            assert span["end"] <= timed["start"] or span["start"] >= timed["end"], (name, span, timed)

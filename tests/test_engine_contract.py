"""The Engine contract (engines/base.py): both engines declare it, and its four optional hooks are found by
calling them, never by probing with getattr."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from lipstream.engines.base import Engine
from lipstream.engines.batched import SessionEngine
from lipstream.engines.musetalk.engine import MuseTalkEngine
from lipstream.engines.viseme.engine import VisemeEngine

PACKAGE = Path(__file__).resolve().parent.parent / "lipstream"
METHODS = ("prepare", "features", "stream_features", "render")
HOOKS = ("for_session", "withdraw", "onset", "release")


@pytest.mark.parametrize("cls", [VisemeEngine, MuseTalkEngine])
def test_both_engines_subclass_the_contract_and_define_its_methods(cls: type) -> None:
    assert Engine in cls.__mro__  # declared, not only shaped like it (issubclass refuses data members)
    for name in METHODS + HOOKS:
        assert callable(getattr(cls, name)), name
        if name in METHODS:  # the required ones are the engine's own, not the contract's empty bodies
            assert getattr(cls, name) is not getattr(Engine, name), name
    for name in ("name", "feature_kind", "patch_size", "accelerate_by_default"):
        assert name in vars(cls), name  # the class says it; the rest are set per instance (sizes, options)


def test_the_viseme_engine_eases_its_edges_and_keeps_the_other_defaults() -> None:
    engine = VisemeEngine()
    assert isinstance(engine, Engine)
    assert engine.for_session(lambda: 0.0) is engine and engine.withdraw() == 0
    closed = np.tile(np.array([0.0, 0.0, 1.0, 0.0], np.float32), (4, 1))
    assert engine.onset(closed, 0)[0, 2] < 1.0  # its own hook: the closure eases in
    assert len(engine.release(closed[-1])) == engine.edges.frames > 0


def test_an_engine_that_overrides_nothing_gets_the_defaults() -> None:
    engine = object.__new__(MuseTalkEngine)  # the hooks' defaults need none of its weights
    rows = np.ones((3, 5), np.float32)
    assert engine.for_session(lambda: 0.0) is engine
    assert engine.withdraw() == 0
    assert engine.onset(rows, 0) is rows
    tail = engine.release(rows[-1])
    assert tail.shape == (0, 5) and tail.dtype == np.float32


def test_a_sessions_view_of_a_batched_engine_is_its_own_view() -> None:
    assert SessionEngine.for_session is not Engine.for_session  # binding twice never leaves the batcher
    assert SessionEngine.withdraw is not Engine.withdraw  # and an interrupt withdraws its queued passes


def test_nothing_probes_an_engine_for_its_hooks() -> None:
    old = 'bind = getattr(engine, "for_session", None)\nwithdraw = getattr(self.engine, "withdraw", None)'
    # an engine's attribute looked up by name (getattr(engine, "onset", None) was how the hooks were found)
    probe = re.compile(r"(getattr|hasattr)\(\s*[\w.]*engine[\w.]*\s*,\s*[\"'](" + "|".join(HOOKS) + r")[\"']")
    assert len(probe.findall(old)) == 2  # the probe finds what it replaced
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{n}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if probe.search(line)
    ]
    assert found == [], f"call the Engine hook instead of probing for it: {found}"

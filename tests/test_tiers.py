"""The tiers stay true: every test that drives Chromium is marked `browser`, every one that starts a server
process `slow`, so `make check` (`-m "not slow and not browser"`) starts neither (docs/testing.md)."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tier_audit import audit, launchers, shared_fixtures, violations_in

TESTS = Path(__file__).resolve().parent


def test_every_browser_or_server_test_carries_its_mark() -> None:
    found = audit(TESTS)
    hint = "unmarked (add the mark to the test or to the module's pytestmark):\n"
    assert not found, hint + "\n".join(map(str, found))


def test_the_browser_scripts_that_start_chromium_are_known() -> None:
    scripts = launchers(TESTS).scripts["browser"]
    assert {"player.mjs", "talk.mjs", "edge.mjs"} <= scripts
    assert "warp_parity.mjs" not in scripts  # node only: no browser, no mark needed


def _violations(source: str) -> set[str]:
    found = launchers(TESTS)
    shared = shared_fixtures(TESTS, found)
    return {str(v) for v in violations_in(textwrap.dedent(source), "m.py", found, shared)}


def test_the_audit_finds_an_unmarked_browser_test_through_helpers_and_fixtures() -> None:
    source = """
        import pytest
        from server_harness import run_browser_script

        def drive(opts):
            return run_browser_script("player.mjs", opts, 60)

        @pytest.fixture(scope="module")
        def page_result():
            return drive({})

        def test_through_a_helper():
            drive({})

        def test_through_a_fixture(page_result):
            pass

        def test_by_script_name(tmp_path):
            run("edge.mjs")

        def test_through_the_shared_server(live_server):
            pass

        @pytest.mark.browser
        @pytest.mark.slow
        def test_marked(live_server):
            drive({})

        def test_plain():
            pass
        """
    assert _violations(source) == {
        "m.py::test_through_a_helper needs pytest.mark.browser",
        "m.py::test_through_a_fixture needs pytest.mark.browser",
        "m.py::test_by_script_name needs pytest.mark.browser",
        "m.py::test_through_the_shared_server needs pytest.mark.slow",
    }


def test_a_module_or_class_mark_covers_its_tests() -> None:
    module = """
        import pytest
        pytestmark = [pytest.mark.slow, pytest.mark.browser]

        def test_a():
            run_browser_script("talk.mjs", {}, 10)
            ServerProcess(None)
        """
    assert _violations(module) == set()
    cls = """
        import pytest

        @pytest.mark.browser
        class TestPage:
            def test_a(self):
                run_browser_script("talk.mjs", {}, 10)
        """
    assert _violations(cls) == set()

"""The page shows the avatar the moment it opens (its idle picture behind the canvas), not a black box."""

from __future__ import annotations

from pathlib import Path

import pytest
import server_harness as harness
from server_harness import ServerProcess, run_browser_script

pytestmark = [pytest.mark.slow, pytest.mark.browser]
avatars_root = harness.avatars_root  # shared fixtures
live_server = harness.live_server


def test_the_page_opens_on_the_avatars_picture(live_server: ServerProcess, tmp_path: Path) -> None:
    options = {"url": live_server.http, "avatar": "small", "out": str(tmp_path), "agent": False}
    result = run_browser_script("persona_page.mjs", options, 120)
    assert result["ok"], result["problems"]
    assert result["poster"]["url"] == "/api/avatars/small/poster.jpg"
    assert (result["poster"]["width"], result["poster"]["height"]) == (360, 640)  # the avatar's own picture
    assert result["personaHidden"] and result["talkVisible"] is False  # a plain server: no persona, no Talk
    assert (tmp_path / "opened.png").stat().st_size > 10_000

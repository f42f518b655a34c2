"""The page player's audio clock when sound arrives late (player.js `_play`, in headless Chromium): late
silence is let go and the clock runs on, sound a few milliseconds late loses its start and plays in time, only
sound later than that restarts the clock a jitter buffer later. Before, any late chunk restarted it: in the
whole-frame stream a speech start's second or third frame, 3-110 ms late on 2 cores, held the speech back
150 ms (benchmarks/scenarios/first_frame.py counts these restarts)."""

from __future__ import annotations

import pytest
from server_harness import run_browser_script

pytestmark = pytest.mark.browser


def test_late_silence_is_skipped_slightly_late_sound_trimmed_and_only_a_gap_restarts_the_clock() -> None:
    cases = run_browser_script("player_clock.mjs", {}, timeout=60)
    assert not cases["problems"], cases["problems"]
    anchored = cases["anchored"]
    assert anchored["late"] == 0 and anchored["anchor"]["pts"] == 0

    silent = cases["lateSilence"]
    assert (silent["late"], silent["silence"], silent["trimmed"]) == (0, 1, 0)
    assert silent["anchor"] == anchored["anchor"]  # the clock was not restarted ...
    assert silent["audioEnd"] == silent["pts"] + 640  # ... and runs on through the silence

    trimmed = cases["slightlyLate"]
    assert (trimmed["late"], trimmed["trimmed"]) == (0, 1) and trimmed["anchor"] == anchored["anchor"]

    on_time = cases["onTime"]
    assert (on_time["late"], on_time["trimmed"], on_time["silence"]) == (0, 1, 1)

    restarted = cases["veryLate"]
    assert restarted["late"] == 1 and restarted["anchor"] != anchored["anchor"]

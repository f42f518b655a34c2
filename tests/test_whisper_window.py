"""The short window's guards: the encoder's window and the cut of a decode that loops back to its start."""

from __future__ import annotations

import pytest

from lipstream.talk.hearing.whisper_window import MIN_FRAMES, context_frames, loop_start, without_loop


@pytest.mark.parametrize(
    ("decoded", "kept"),
    [
        ("Hello? Hello?", "Hello?"),
        ("Hello? Hello? Hello?", "Hello?"),
        ("What time does the library open? What time does the", "What time does the library open?"),
        # the repeat's last word cut short by the token bound
        ("Can you tell me a joke, cat? Can you tell me a jo", "Can you tell me a joke, cat?"),
        ("What is the capital city of Australia? What is", "What is the capital city of Australia?"),
    ],
)
def test_a_decode_that_loops_back_to_its_start_is_cut_where_the_loop_begins(decoded: str, kept: str) -> None:
    assert without_loop(decoded) == kept


@pytest.mark.parametrize(
    "said",
    [
        "Hello? Hello? Are you there?",  # a phrase repeated, then more: no loop
        "I know that that is true.",
        "What is what you said?",
        "What is what",  # one word again after a longer start: the start of a question, not a loop
        "That's that.",
        "How far is the station from here?",
        "",
    ],
)
def test_speech_that_only_repeats_words_is_left_as_it_was_heard(said: str) -> None:
    assert without_loop(said) == said
    assert loop_start(said.split()) is None


def test_the_encoder_reads_the_audio_plus_a_second_and_never_less_than_the_floor() -> None:
    assert context_frames(250) == MIN_FRAMES == 500  # a 2.5 s question: the 5 s floor
    assert context_frames(620) == 800  # 6.2 s + 1 s, whole seconds
    assert context_frames(2950) == 3000  # never more than Whisper's 30 s

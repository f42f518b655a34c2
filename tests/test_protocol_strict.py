"""The control-message parser is strict and total: any bad input is a ProtocolError with a documented code."""

from __future__ import annotations

import json

import pytest

from lipstream.server.protocol import (
    MAX_SAFE_INT,
    ClientStats,
    Hello,
    Ping,
    Position,
    ProtocolError,
    Speak,
    decode_media,
    parse_control,
)


def refused(text: str, fragment: str = "", code: str = "bad_message") -> ProtocolError:
    """Assert that `text` is refused with `code` and a message containing `fragment`."""
    with pytest.raises(ProtocolError) as info:
        parse_control(text)
    assert info.value.code == code, str(info.value)
    assert fragment in str(info.value)
    return info.value


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,
        '{"a":' * 100_000,
        '{"type": "ping", "id": ' + "[" * 900 + "]" * 900 + "}",  # parses, but nests past the limit
        '{"type": "client_stats", "av_offset_ms": ' + '{"x": ' * 500 + "0" + "}" * 501,
    ],
)
def test_deeply_nested_json_is_bad_message_not_recursion_error(text: str) -> None:
    refused(text, "nests")


def test_shallow_unknown_nesting_in_ignored_fields_is_fine() -> None:
    msg = parse_control('{"type": "ping", "id": 1, "future": {"a": [[1, 2], {"b": null}]}}')
    assert msg == Ping(type="ping", id=1)


@pytest.mark.parametrize("version", ['"1"', "1.0", "true", "null", "[1]"])
def test_hello_version_must_be_a_real_int(version: str) -> None:
    refused(f'{{"type": "hello", "version": {version}}}', "version")


def test_hello_version_other_ints_parse_so_the_server_can_answer_version() -> None:
    assert parse_control('{"type": "hello", "version": 2}').version == 2


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ('{"type": "position", "pts": "5"}', "pts"),
        ('{"type": "position", "pts": 5.0}', "pts"),
        ('{"type": "position", "pts": true}', "pts"),
        ('{"type": "hello", "output_width": "540"}', "output_width"),
        ('{"type": "hello", "output_width": 540.0}', "output_width"),
        ('{"type": "client_stats", "frames_shown": "3"}', "frames_shown"),
        ('{"type": "client_stats", "frames_late": 1.5}', "frames_late"),
        ('{"type": "client_stats", "decode_errors": false}', "decode_errors"),
        ('{"type": "client_stats", "ttff_ms": "120"}', "ttff_ms"),
        ('{"type": "client_stats", "av_offset_ms": {"p50": true}}', "av_offset_ms.p50"),
        ('{"type": "speak", "text": 5}', "text"),
        ('{"type": "speak", "text": "hi", "voice": 1}', "voice"),
    ],
)
def test_numbers_and_strings_are_not_coerced(text: str, field: str) -> None:
    refused(text, field)


def test_client_stats_floats_accept_ints_and_keep_counts_as_ints() -> None:
    stats = parse_control(
        json.dumps(
            {
                "type": "client_stats",
                "av_offset_ms": {"p50": 4, "p95": 9.5, "max": -3, "mean": 1, "count": 3},
                "frames_shown": 10,
                "ttff_ms": 250,
            }
        )
    )
    assert isinstance(stats, ClientStats)
    assert stats.av_offset_ms.p50 == 4.0 and isinstance(stats.av_offset_ms.p50, float)
    assert stats.av_offset_ms.max == -3.0 and stats.ttff_ms == 250.0


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"type": "client_stats", "frames_shown": -1}', "frames_shown"),
        (f'{{"type": "client_stats", "frames_dropped": {2**53}}}', "frames_dropped"),
        ('{"type": "client_stats", "av_offset_ms": {"count": -2}}', "av_offset_ms.count"),
        ('{"type": "client_stats", "ttff_ms": -5}', "ttff_ms"),
        ('{"type": "client_stats", "ttff_ms": 1e400}', "finite"),  # json reads 1e400 as inf
        ('{"type": "client_stats", "av_offset_ms": {"p95": -1e999}}', "finite"),
    ],
)
def test_client_stats_counts_are_bounded_and_floats_finite(text: str, fragment: str) -> None:
    refused(text, fragment)


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_nan_and_infinity_literals_are_refused_anywhere(literal: str) -> None:
    refused(f'{{"type": "client_stats", "ttff_ms": {literal}}}', literal)
    refused(f'{{"type": "ping", "future": [{literal}]}}', literal)  # even in an ignored field


@pytest.mark.parametrize(
    ("escaped", "fragment"),
    [
        ("\\u0000", "control character U+0000"),
        ("\\u0007", "control character U+0007"),
        ("\\u001b[2J", "control character U+001B"),
        ("\\u007f", "control character U+007F"),
        ("\\u0085", "control character U+0085"),
        ("\\ud800", "lone UTF-16 surrogate U+D800"),
        ("\\udfff tail", "lone UTF-16 surrogate U+DFFF"),
    ],
)
def test_speak_text_with_control_characters_or_surrogates_is_bad_text(escaped: str, fragment: str) -> None:
    error = refused(f'{{"type": "speak", "text": "Hello {escaped} there"}}', fragment, code="bad_text")
    assert "index 6" in str(error)


def test_speak_text_keeps_newlines_tabs_and_real_non_ascii() -> None:
    msg = parse_control('{"type": "speak", "text": "Hi\\n\\tthere\\r\\n caf\\u00e9 \\ud83d\\ude00"}')
    assert isinstance(msg, Speak) and msg.text == "Hi\n\tthere\r\n café 😀"


@pytest.mark.parametrize("voice", ["piper", "espeak", "en_US-joe-medium", "A" * 32])
def test_voice_names_of_the_known_shape_parse(voice: str) -> None:
    assert parse_control(json.dumps({"type": "speak", "text": "hi", "voice": voice})).voice == voice


@pytest.mark.parametrize("voice", ["", "../etc/passwd", "a b", "x" * 33, "piper\u0000", "voix-é", "a/b"])
def test_voice_of_any_other_shape_is_bad_message(voice: str) -> None:
    refused(json.dumps({"type": "speak", "text": "hi", "voice": voice}), "voice")


@pytest.mark.parametrize("pts", [0, 640, 2**40, MAX_SAFE_INT])
def test_position_pts_in_range_parses(pts: int) -> None:
    assert parse_control(f'{{"type": "position", "pts": {pts}}}') == Position(type="position", pts=pts)


@pytest.mark.parametrize("pts", [-1, 2**53, 2**64, 10**400, "1" + "0" * 5000])
def test_position_pts_out_of_range_is_bad_message(pts: int | str) -> None:
    # 10**5000 also trips Python's 4300-digit int parsing limit (a ValueError inside json.loads)
    refused(f'{{"type": "position", "pts": {pts}}}')


@pytest.mark.parametrize(("width", "ok"), [(16, True), (540, True), (8192, True), (15, False), (8193, False)])
def test_hello_output_width_sane_range(width: int, ok: bool) -> None:
    text = f'{{"type": "hello", "version": 1, "output_width": {width}}}'
    if ok:
        assert parse_control(text) == Hello(type="hello", version=1, output_width=width)
    else:
        refused(text, "output_width")


@pytest.mark.parametrize("ping_id", [None, 0, -7, MAX_SAFE_INT, -MAX_SAFE_INT, "", "abc", "x" * 64])
def test_ping_ids_that_parse(ping_id: int | str | None) -> None:
    assert parse_control(json.dumps({"type": "ping", "id": ping_id})).id == ping_id


@pytest.mark.parametrize("ping_id", [2**53, -(2**53), 10**30, "x" * 65, True, 1.5, [1], {"a": 1}])
def test_ping_ids_that_do_not(ping_id: object) -> None:
    refused(json.dumps({"type": "ping", "id": ping_id}), "id")


@pytest.mark.parametrize(
    "text",
    [
        '{"type": "hello", "token": "abc\\udc00"}',
        '{"type": "hello", "token": "abc\\u0000"}',
        '{"type": "hello", "avatar": "small\\u0000"}',
        json.dumps({"type": "hello", "avatar": "a" * 129}),
        json.dumps({"type": "hello", "token": "t" * 1025}),
    ],
)
def test_hello_names_and_tokens_are_short_clean_strings(text: str) -> None:
    refused(text)


@pytest.mark.parametrize(
    "text",
    [
        '{"type": 5}',
        '{"type": null}',
        '{"type": ["speak"]}',
        '{"type": {"a": 1}}',
        json.dumps({"type": "x" * 100_000}),
    ],
)
def test_type_must_be_a_known_string_and_errors_stay_short(text: str) -> None:
    error = refused(text, "unknown message type")
    assert len(str(error)) < 200


def test_unknown_fields_are_ignored_for_forward_compatibility() -> None:
    msg = parse_control('{"type": "keyframe", "reason": "decoder reset", "n": [1, {"x": 2}]}')
    assert msg.type == "keyframe" and not hasattr(msg, "reason")


@pytest.mark.parametrize(
    "text",
    ["", " ", "\u0000", "\ud800", '"\\ud800"', "1" * 5000, "-", "nul", '{"type": "ping"', "\ufeff{}"],
)
def test_odd_inputs_are_protocol_errors(text: str) -> None:
    refused(text)


def test_non_text_input_is_a_protocol_error() -> None:
    refused(b'{"type": "ping"}')  # type: ignore[arg-type]
    with pytest.raises(ProtocolError, match="must be bytes"):
        decode_media("not bytes")  # type: ignore[arg-type]

"""Text on the serverless page: Piper in the browser (eSpeak NG wasm + onnxruntime-web) vs piper-tts in
Python, the page speaking typed text, the server's POST /api/tts fallback, and bad input."""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from server_harness import ServerProcess, run_browser_script
from test_edge_web import StaticServer

from lipstream.cli import main
from lipstream.edge.web_export import copy_page

pytestmark = [pytest.mark.slow, pytest.mark.browser]  # the Piper voice, exports, Chromium

# numbers, clause punctuation, a question; 'four'/'more' and linking 'ʲ' exercise clauses.js's rewrites
ID_TEXTS = [
    "It costs 42 dollars, or 3.5 euros; cheap!",
    "Is this the right way to the station? Dr. Smith lives at 221B Baker Street.",
    "She said: we eat at three o'clock, more or less.",
]
AUDIO_TEXT = "Hello world. Is this the right way to the station?"


@pytest.fixture(scope="module")
def voiced_export(small_avatar, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small avatar exported with the bundled voice (real CLI)."""
    out = tmp_path_factory.mktemp("edge_tts") / "small-voice"
    root = Path(small_avatar.path).parent
    assert main(["export", "web", "small", "-o", str(out), "--avatars-dir", str(root), "--voice"]) == 0
    return out


@pytest.fixture(scope="module")
def voiced_server(voiced_export: Path) -> Iterator[StaticServer]:
    server = StaticServer(voiced_export)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def piper_voice():
    from piper import PiperVoice

    from lipstream.talk.voices.piper_tts import bundled_voice_path

    return PiperVoice.load(bundled_voice_path())


def test_voice_travels_only_when_asked(voiced_export: Path, tmp_path: Path) -> None:
    manifest = json.loads((voiced_export / "export.json").read_text())
    voice = manifest["tts"]["voice"]
    assert voice["sample_rate"] == 22050 and voice["espeak_voice"] == "en-us"
    assert manifest["files"][voice["model"]]["bytes"] > 50_000_000
    for rel in (
        "tts/vendor/phonemizer.js",
        "tts/ort/ort.wasm.min.mjs",
        "tts/ort/ort-wasm-simd-threaded.wasm",
    ):
        assert (voiced_export / rel).is_file(), rel
    lean = copy_page(tmp_path / "lean")  # the default export's page: TTS modules, no runtime, no voice
    assert "tts/tts.js" in lean and not any(p.startswith(("tts/ort", "tts/vendor")) for p in lean)


def test_missing_voice_file_is_one_line_and_writes_nothing(small_avatar, tmp_path: Path, capsys) -> None:
    out = tmp_path / "out"
    root = Path(small_avatar.path).parent
    code = main(["export", "web", "small", "-o", str(out), "--avatars-dir", str(root),
                 "--voice", str(tmp_path / "nope.onnx")])  # fmt: skip
    err = capsys.readouterr().err
    assert code != 0 and "nope.onnx is missing" in err and not out.exists()
    assert not list(tmp_path.glob(".out.partial-*"))


def test_browser_phoneme_ids_equal_piper_tts(voiced_server: StaticServer, piper_voice) -> None:
    result = run_browser_script(
        "edge_tts.mjs", {"url": voiced_server.url, "scenario": "phonemes", "texts": ID_TEXTS}, 90
    )
    assert not result["problems"], result["problems"]
    for text, browser in zip(ID_TEXTS, result["sentences"], strict=True):
        python = [piper_voice.phonemes_to_ids(p) for p in piper_voice.phonemize(text)]
        assert [s["ids"] for s in browser] == python, (text, [s["phonemes"] for s in browser])
        assert all(not s["missing"] for s in browser)


def test_browser_audio_matches_piper_tts(voiced_server: StaticServer, piper_voice, tmp_path: Path) -> None:
    from piper import SynthesisConfig

    from lipstream.talk.voices.piper_tts import PiperTTS

    result = run_browser_script(
        "edge_tts.mjs",
        {"url": voiced_server.url, "scenario": "audio", "texts": [AUDIO_TEXT], "outDir": str(tmp_path)}, 90,
    )  # fmt: skip
    assert result["files"][0]["sentences"] == 2  # sentence by sentence
    chunks = piper_voice.synthesize(
        AUDIO_TEXT, syn_config=SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    )
    python = np.concatenate([c.audio_float_array for c in chunks])
    browser = np.fromfile(tmp_path / "raw_0.f32", dtype=np.float32)
    assert abs(len(browser) - len(python)) <= 0.01 * len(python)
    n = min(len(browser), len(python))
    assert np.corrcoef(browser[:n], python[:n])[0, 1] > 0.999  # measured 0.9999999998, max |diff| 5e-5
    # 16 kHz for the engine: the JS windowed sinc vs lipstream's libswresample path
    python16 = PiperTTS().synthesize(AUDIO_TEXT).pcm
    browser16 = np.fromfile(tmp_path / "pcm16_0.f32", dtype=np.float32)
    assert abs(len(browser16) - len(python16)) <= 0.01 * len(python16)
    m = min(len(browser16), len(python16))
    assert np.corrcoef(browser16[:m], python16[:m])[0, 1] > 0.99


def test_page_speaks_typed_text_end_to_end(voiced_server: StaticServer, tmp_path: Path) -> None:
    result = run_browser_script(
        "edge_tts.mjs",
        {"url": voiced_server.url, "scenario": "speak", "texts": [AUDIO_TEXT],
         "screenshot": str(tmp_path / "speak.png")}, 90,
    )  # fmt: skip
    stats = result["stats"]
    types = [e["type"] for e in stats["events"]]
    assert types[0] == "speak" and "playback_started" in types and types[-1] == "playback_finished"
    assert stats["events"][-1]["interrupted"] is False and not result["state"]["error"]
    assert stats["patches"] > 25 and stats["speechFramesShown"] > 0  # the mouth moved
    assert len(stats["sentences"]) == 2 and stats["firstAudioMs"] is not None


def test_bad_text_is_named_on_the_page(voiced_server: StaticServer) -> None:
    result = run_browser_script(
        "edge_tts.mjs",
        {"url": voiced_server.url, "scenario": "bad_text", "texts": ["   ", "?!", "a" * 5001]},
        90,
    )
    empty, punctuation, long = result["messages"]
    assert "nothing to speak" in empty and "nothing to speak" in punctuation
    assert "5001 characters, over the limit of 5000" in long


def test_missing_voice_file_is_named_on_the_page(voiced_export: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(voiced_export, broken)
    (broken / "data" / "tts" / "voice.onnx").unlink()
    state = _text_controls_of(broken)
    assert "data/tts/voice.onnx: is missing (HTTP 404)" in state["error"] and state["textDisabled"]


def test_static_page_without_voice_says_why(small_avatar, tmp_path: Path) -> None:
    out = tmp_path / "lean"
    assert (
        main(["export", "web", "small", "-o", str(out), "--avatars-dir", str(Path(small_avatar.path).parent)])
        == 0
    )
    state = _text_controls_of(out)
    assert (
        state["textDisabled"] and "carries no voice" in state["textnote"] and "/api/tts" in state["textnote"]
    )


def _text_controls_of(export: Path) -> dict:
    """The page's text controls (error, note, disabled) when `export`, served statically, cannot speak."""
    server = StaticServer(export)
    try:
        return run_browser_script("edge_tts.mjs", {"url": server.url, "scenario": "unavailable"}, 90)["state"]
    finally:
        server.stop()


def _post(url: str, body: bytes, token: str | None = "t", ctype: str = "application/json"):
    headers = {"Content-Type": ctype, **({"Authorization": f"Bearer {token}"} if token else {})}
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            return answer.status, answer.headers.get("content-type"), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("content-type"), exc.read()


def test_server_tts_endpoint_and_page_fallback(small_avatar, tmp_path: Path) -> None:
    root = tmp_path / "avatars"
    shutil.copytree(Path(small_avatar.path), root / "small")
    server = ServerProcess(root, "--token", "t")
    try:
        url = f"{server.http}/api/tts"
        assert _post(url, b'{"text": "hi"}', token=None)[0] == 401
        status, ctype, wav = _post(url, json.dumps({"text": "Hello there."}).encode())
        assert status == 200 and ctype == "audio/wav" and wav[:4] == b"RIFF" and len(wav) > 16000
        for body, code, what in [
            (b"not json", 400, "not JSON"), (b'{"text": "hi", "x": 1}', 400, "exactly"),
            (b'{"text": 5}', 400, "exactly"), (b'{"text": "  "}', 400, "nothing to speak"),
            (json.dumps({"text": "a" * 4001}).encode(), 413, "over the limit of 4000"),
        ]:  # fmt: skip
            status, _, answer = _post(url, body)
            assert status == code and what in json.loads(answer)["message"], (body[:30], answer)
        assert _post(url, b'{"text": "hi"}', ctype="text/plain")[0] == 415
        result = run_browser_script(
            "edge_tts.mjs",
            {
                "url": f"{server.http}/edge/small/?token=t",
                "scenario": "speak",
                "texts": ["Hello there, friend."],
            },
            120,
        )
    finally:
        server.stop()
    assert result["state"]["mode"] == "server" and "server's voice" in result["state"]["textnote"]
    types = [e["type"] for e in result["stats"]["events"]]
    assert "playback_started" in types and types[-1] == "playback_finished" and result["stats"]["patches"] > 0

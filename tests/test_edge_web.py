"""`lipstream export web` and its serverless page: the folder, a real static server, headless Chromium."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import av
import numpy as np
import pytest
from server_harness import ServerProcess, run_browser_script

from lipstream.audio.encode import wav_bytes
from lipstream.cli import main

pytestmark = pytest.mark.slow  # an export of the small avatar, a static server and node

SPEECH_TEXT = "Maybe the weather will be warmer on Thursday, said Bob."


class StaticServer:
    """`python -m http.server` on a free port, serving a folder (no lipstream code runs in it)."""

    def __init__(self, folder: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "http.server", "0", "--bind", "127.0.0.1", "-d", str(folder)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        match = re.search(r"port (\d+)", line)
        if not match:
            self.proc.kill()
            raise RuntimeError(f"http.server did not start: {line}")
        self.url = f"http://127.0.0.1:{match.group(1)}/"

    def stop(self) -> None:
        """Terminate and reap it."""
        self.proc.terminate()
        self.proc.wait(timeout=10)


def write_wav(path: Path, pcm: np.ndarray) -> np.ndarray:
    """16 kHz mono 16-bit WAV; returns the float PCM exactly as a decoder reads it back (int16 / 32768)."""
    path.write_bytes(wav_bytes(pcm))
    return (np.clip(pcm, -1.0, 1.0) * 32767).astype("<i2").astype(np.float32) / 32768.0


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """An espeak sentence as a WAV file and its PCM."""
    from lipstream.talk.voices.tts import create_tts

    speech = create_tts("espeak").synthesize(SPEECH_TEXT)
    path = tmp_path_factory.mktemp("edge_audio") / "speech.wav"
    return path, write_wav(path, speech.pcm)


@pytest.fixture(scope="module")
def avatars_root(small_avatar) -> Path:
    """The folder holding the small fixture avatar."""
    return Path(small_avatar.path).parent


@pytest.fixture(scope="module")
def exported(avatars_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small avatar exported with the real CLI."""
    out = tmp_path_factory.mktemp("edge_export") / "small-web"
    assert main(["export", "web", "small", "-o", str(out), "--avatars-dir", str(avatars_root)]) == 0
    return out


@pytest.fixture(scope="module")
def static_server(exported: Path) -> Iterator[StaticServer]:
    """The export behind a plain static server process."""
    server = StaticServer(exported)
    yield server
    server.stop()


# ---- the folder ----------------------------------------------------------------------------------


def test_export_folder_is_complete_and_lean(exported: Path, small_avatar) -> None:
    manifest = json.loads((exported / "export.json").read_text())
    assert manifest["format"] == "lipstream-web-export" and manifest["engine"] == "viseme"
    assert manifest["frame_count"] == small_avatar.frame_count
    assert manifest["loop"]["frames"] == np.asarray(small_avatar.idle_loop).tolist()
    assert manifest["boxes"] == np.asarray(small_avatar.boxes).tolist()
    for rel, meta in manifest["files"].items():  # every data file listed with its size and digest
        data = (exported / rel).read_bytes()
        assert len(data) == meta["bytes"] and hashlib.sha256(data).hexdigest() == meta["sha256"], rel
    for page_file in ("index.html", "main.js", "compositor.js", "viseme/engine.js", "viseme/warp.js"):
        assert (exported / page_file).is_file(), page_file
    assert not list(exported.rglob("node_modules")) and not list(exported.parent.glob(".small-web*"))
    # Masks, crops and parameters stay small next to the video (50 frames here).
    sizes = {rel: meta["bytes"] for rel, meta in manifest["files"].items()}
    assert sizes["data/masks.pngs"] < 5_000 * manifest["frame_count"]
    assert sizes["data/crops.jpgs"] < 25_000 * manifest["frame_count"]


def test_base_video_is_the_idle_loop_in_short_gops(exported: Path, small_avatar) -> None:
    manifest = json.loads((exported / "export.json").read_text())
    with av.open(str(exported / manifest["video"]["file"])) as container:
        stream = container.streams.video[0]
        packets = [p for p in container.demux(stream) if p.size]
    assert (stream.codec_context.width, stream.codec_context.height) == small_avatar.size
    assert len(packets) == len(small_avatar.idle_loop) == manifest["video"]["frames"]
    keys = [i for i, p in enumerate(packets) if p.is_keyframe]
    assert keys[0] == 0 and max(np.diff(keys + [len(packets)])) <= manifest["video"]["gop"]
    assert [p.pts for p in packets] == sorted(p.pts for p in packets)  # no B-frames: decode order = display


def test_unknown_avatar_is_one_line_and_writes_nothing(avatars_root: Path, tmp_path: Path, capsys) -> None:
    out = tmp_path / "nobody-web"
    assert main(["export", "web", "nobody", "-o", str(out), "--avatars-dir", str(avatars_root)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown avatar 'nobody'") and "\n" not in err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_existing_output_and_missing_onnx_are_refused(avatars_root: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "taken").mkdir()
    args = ["--avatars-dir", str(avatars_root)]
    assert main(["export", "web", "small", "-o", str(tmp_path / "taken"), *args]) == 2
    assert "already exists" in capsys.readouterr().err
    assert main(["export", "web", "small", "-o", str(tmp_path / "mt"), "--engine", "musetalk", *args]) == 2
    assert "--onnx" in capsys.readouterr().err
    empty = tmp_path / "onnx"
    empty.mkdir()
    mt = ["export", "web", "small", "-o", str(tmp_path / "mt"), "--engine", "musetalk"]
    assert main([*mt, "--onnx", str(empty), *args]) == 2
    assert "manifest.json" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["onnx", "taken"]


# ---- the page in headless Chromium, behind python -m http.server ---------------------------------


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return float("inf") if mse == 0 else 10.0 * np.log10(255.0**2 / mse)


@pytest.mark.browser
def test_page_plays_a_wav_from_a_plain_static_server(static_server: StaticServer, speech_wav) -> None:
    wav, pcm = speech_wav
    opts = {"url": static_server.url, "scenario": "play", "wav": str(wav)}
    result = run_browser_script("edge.mjs", opts, 180)
    assert [e["type"] for e in result["events"]][-2:] == ["playback_started", "playback_finished"]
    assert not result["errors"] and not result["problems"], (result["errors"], result["problems"])
    frames = len(pcm) // 640
    # The audio clock walked through the utterance (a loaded machine may skip a display frame or two).
    assert max(e["k"] for e in result["log"]) >= frames - 2
    assert result["framesShown"] + result["skipped"] >= frames - 2
    mouth = [e for e in result["log"] if e["mouth"]]
    assert len({e["k"] for e in mouth}) > frames // 3  # and the mouth moved for much of it
    assert static_server.proc.poll() is None  # nothing but the static server behind the page


@pytest.mark.browser
def test_js_viseme_engine_matches_python_on_the_mouth(
    static_server: StaticServer, speech_wav, small_avatar, tmp_path: Path
) -> None:
    from lipstream.engines.base import Speech
    from lipstream.engines.viseme.engine import VisemeEngine

    wav, pcm = speech_wav
    opts = {"url": static_server.url, "scenario": "parity", "wav": str(wav), "outDir": str(tmp_path)}
    result = run_browser_script("edge.mjs", opts, 180)
    assert result["samples"] == len(pcm)
    frames = result["frames"]
    engine = VisemeEngine()
    # as a live session draws them: the closure eased in from the footage's mouth, then the frames after the
    # audio that ease the last row back to it
    features = engine.onset(engine.features(Speech(pcm=pcm)), 0)
    features = np.concatenate([features, engine.release(features[-1])])
    assert [f["frame"] for f in frames] == list(range(len(features)))
    assert [f["frame"] for f in frames if f["release"]] == list(range(len(pcm) // 640, len(features)))
    js_features = np.array([f["feature"] for f in frames], dtype=np.float32)
    assert np.abs(js_features - features).max() < 2e-3
    moved = [f for f in frames if f["moved"]]
    assert len(moved) > len(frames) // 3
    js = np.fromfile(tmp_path / "patches.rgba", dtype=np.uint8).reshape(len(moved), 256, 256, 4)
    ids = np.array([f["sourceFrame"] for f in moved])
    loop = np.asarray(small_avatar.idle_loop)
    assert (ids == loop[[f["frame"] for f in moved] % np.int64(len(loop))]).all()
    py = engine.render(small_avatar, features[[f["frame"] for f in moved]], ids)
    masks = np.asarray(small_avatar.masks)[ids]
    assert (js[..., 3] == masks).all()  # the mask rides in alpha, losslessly
    inside = masks > 0
    psnr = _psnr(js[..., :3][inside], py[inside])
    worst = min(_psnr(js[i, ..., :3][inside[i]], py[i][inside[i]]) for i in range(len(moved)))
    # The patches really differ from the rest mouth (the comparison is not of two unchanged crops).
    crops = np.stack([engine._cache(small_avatar).crops[i] for i in ids])
    assert _psnr(py[inside], crops[inside]) < 30.0
    print(f"JS vs Python mouth PSNR {psnr:.2f} dB (worst frame {worst:.2f} dB, {len(moved)} frames)")
    assert psnr >= 35.0 and worst >= 30.0, (psnr, worst)


def _stall_index(small_avatar) -> int:
    """The loop index whose face box is furthest from where the others' are (a stall there is visible)."""
    boxes = np.asarray(small_avatar.boxes, dtype=np.float64)
    centres = (boxes[:, :2] + boxes[:, 2:]) / 2
    far = np.linalg.norm(centres - centres.mean(axis=0), axis=1)
    return int(np.argmax(far))  # loop index i < frame_count shows source frame i


@pytest.mark.browser
def test_head_tracking_follows_the_displayed_frame_when_the_video_stalls(
    static_server: StaticServer, speech_wav, small_avatar
) -> None:
    wav, _ = speech_wav
    stall = _stall_index(small_avatar)
    opts = {"url": static_server.url, "scenario": "stall", "wav": str(wav), "stallLoopIndex": stall}
    result = run_browser_script("edge.mjs", opts, 180)
    box = np.asarray(small_avatar.boxes[stall])
    # Every drawn frame used the stalled frame's box, although the patches were rendered for frames the
    # audio clock expected on screen (they moved on with the audio).
    speech = [e for e in result["log"] if e["mouth"]]
    shown = sorted({e["loopIndex"] for e in speech})
    assert speech and shown == [stall], (shown, stall)
    assert len({e["patchSource"] for e in speech}) > 5
    for sample in result["boxes"]:
        x1, y1, x2, y2 = sample["overlay"]
        assert x1 >= box[0] - 1 and y1 >= box[1] - 1 and x2 <= box[2] + 1 and y2 <= box[3] + 1, (sample, box)
        other = np.asarray(small_avatar.boxes[sample["entry"]["patchSource"]])
        if np.abs(other - box).max() > 8:  # where the audio frame's box differs, the mouth did not go there
            assert (x1, y1, x2, y2) != tuple(other)


@pytest.mark.browser
def test_undecodable_audio_is_named_on_the_page(static_server: StaticServer, tmp_path: Path) -> None:
    bad = tmp_path / "noise.wav"
    bad.write_bytes(b"RIFF\x24\x00\x00\x00WAVEjunk" + bytes(range(256)) * 8)
    opts = {"url": static_server.url, "scenario": "bad_audio", "wav": str(bad)}
    result = run_browser_script("edge.mjs", opts, 120)
    assert "cannot decode 'noise.wav'" in result["error"] and result["playDisabled"]


@pytest.mark.browser
@pytest.mark.parametrize("damage", ["missing", "corrupted"])
def test_missing_or_corrupted_file_is_named_on_the_page(exported: Path, tmp_path: Path, damage: str) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(exported, broken)
    target = broken / "data" / ("crops.jpgs" if damage == "missing" else "masks.pngs")
    if damage == "missing":
        target.unlink()
    else:
        # Every bit of 64 bytes flipped: the size stays, the content surely changes. (Zeroing them did not:
        # the deflated masks hold long zero runs, and the middle of the pack can fall in one.)
        data = bytearray(target.read_bytes())
        for i in range(len(data) // 2, len(data) // 2 + 64):
            data[i] ^= 0xFF
        target.write_bytes(bytes(data))
    server = StaticServer(broken)
    try:
        result = run_browser_script("edge.mjs", {"url": server.url, "scenario": "broken"}, 120)
    finally:
        server.stop()
    name = "data/crops.jpgs" if damage == "missing" else "data/masks.pngs"
    assert name in result["error"] and damage in result["error"] and result["status"] == "failed"


# ---- blinks at phrase ends ---------------------------------------------------------------------

PHRASES = ("The bridge reopened today.", "Traffic is moving again.")


def _blink_starts(machine, voiced: np.ndarray, at0: int, loop: int) -> list[int]:
    starts = []
    for k, v in enumerate(voiced):
        machine.step(k, bool(v), (at0 + k) % loop)
        if machine.started == k:
            starts.append(k)
    return starts


def _clear_loop_index(manifest: dict, pcm: np.ndarray) -> int:
    """Where to hold the video so that the speech's phrase ends (found as Python finds them) lie furthest from
    the loop's drawn blinks: the page may then blink at any of them (each decided by its frame's hash)."""
    from lipstream.avatar.phrase_blinks import PhraseBlinkConfig, PhraseEndBlinks
    from lipstream.engines.base import Speech
    from lipstream.engines.viseme.engine import VisemeEngine

    fps, gap = manifest["fps"], manifest["blinks"]["phrase"]["gap_s"]
    features = VisemeEngine().features(Speech(pcm=pcm))
    voiced = np.delete(features, 2, axis=1).any(axis=1)  # as main.js decides (Python's atlas `speaking`)
    loop, drawn = len(manifest["loop"]["frames"]), np.asarray(manifest["blinks"]["drawn_starts"])
    every = PhraseEndBlinks(loop, [], fps, PhraseBlinkConfig(chance=1.0, gap_s=0.0))  # each phrase end
    ends = _blink_starts(every, voiced, 0, loop)

    def clearance(at0: int) -> int:
        positions = (at0 + np.asarray(ends))[:, None]
        return int(np.minimum((positions - drawn) % loop, (drawn - positions) % loop).min())

    best = max(range(loop), key=clearance)
    assert ends and clearance(best) > gap * fps + 2, ends
    assert _blink_starts(PhraseEndBlinks(loop, drawn.tolist(), fps), voiced, best, loop), (ends, best)
    return best  # Python blinks at a phrase end there: so must the page


@pytest.fixture(scope="module")
def photo_export(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """The astronaut photo prepared (blinks drawn, no breathing: 4 pictures) and exported; its manifest."""
    import cv2
    from skimage import data as skdata

    from lipstream.avatar.breathing import BreathingConfig
    from lipstream.avatar.prepare import PrepareConfig, prepare_avatar

    root = tmp_path_factory.mktemp("photo_avatar")
    photo = root / "astronaut.png"
    cv2.imwrite(str(photo), cv2.cvtColor(skdata.astronaut(), cv2.COLOR_RGB2BGR))
    config = PrepareConfig(breathing=BreathingConfig(enabled=False))
    prepare_avatar(photo, "astro", avatars_root=root / "avatars", progress=False, config=config)
    out = root / "astro-web"
    assert main(["export", "web", "astro", "-o", str(out), "--avatars-dir", str(root / "avatars")]) == 0
    return out, json.loads((out / "export.json").read_text())


def test_the_export_carries_eye_points_and_the_blink_machine(photo_export, small_avatar, exported) -> None:
    from lipstream.avatar.blink import EYES, BlinkConfig
    from lipstream.avatar.bundle import load_avatar
    from lipstream.avatar.phrase_blinks import PhraseBlinkConfig

    folder, manifest = photo_export
    bundle = load_avatar("astro", folder.parent / "avatars")
    starts = bundle.manifest.drawn_blink_starts()
    assert starts and manifest["blinks"]["drawn_starts"] == starts
    assert manifest["blinks"]["phrase"] == PhraseBlinkConfig().entry()
    lid = BlinkConfig()
    want = {"meet": lid.meet, "lid_reach": lid.lid_reach, "close_share": lid.close_share,
            "shut_share": lid.shut_share, "lash": lid.lash, "lash_keep": lid.lash_keep,
            "lower_skip": lid.lower_skip}
    assert manifest["blinks"]["lid"] == want
    ids = [i for pair in EYES for contour in pair for i in contour]
    for i, row in enumerate(manifest["eyes"]):
        assert np.abs(np.asarray(row).reshape(36, 2) - bundle.landmarks[i][ids]).max() <= 0.005 + 1e-6
    # the clip: frames its loop never shows carry no points
    clip = json.loads((exported / "export.json").read_text())
    shown = set(np.asarray(small_avatar.display_frames).tolist())
    assert [row is not None for row in clip["eyes"]] == [i in shown for i in range(small_avatar.frame_count)]


@pytest.mark.browser
def test_the_page_blinks_at_a_phrase_end_and_lowers_the_lids(photo_export, tmp_path: Path) -> None:
    from lipstream.talk.voices.tts import create_tts

    folder, manifest = photo_export
    tts = create_tts("espeak")
    pause = np.zeros(int(0.7 * 16000), np.float32)
    pcm = np.concatenate([part for text in PHRASES for part in (tts.synthesize(text).pcm, pause)])
    wav = tmp_path / "phrases.wav"
    pcm = write_wav(wav, pcm)
    server = StaticServer(folder)
    try:
        hold = _clear_loop_index(manifest, pcm)
        opts = {"url": server.url, "scenario": "blink", "wav": str(wav), "stallLoopIndex": hold}
        result = run_browser_script("edge.mjs", opts, 120)
    finally:
        server.stop()
    assert not result["errors"] and not result["problems"], (result["errors"], result["problems"])
    print(f"phrase blinks began at {result['blinkStarts']}, {result['blinks']} drawn: {result['samples']}")
    assert result["blinks"] >= 1 and result["blinkStarts"]
    # drawn while its frames were heard: each start's frames show the lids, the frames before it none
    lids = {e["k"]: e["lids"] for e in result["log"]}
    first = result["blinkStarts"][0]
    assert any(lids.get(k, 0) > 0 for k in range(first, first + 4))
    assert all(lids.get(k, 0) == 0 for k in range(first - 10, first))
    # the overlay's eye rectangle holds the lowered lids: opaque, and unlike the video's own eyes there
    assert result["samples"], "no display frame caught the lids up"
    shut = max(result["samples"], key=lambda s: s["closure"])
    assert shut["opaque"] == shut["pixels"] and shut["differs"] > 30, shut
    assert result["leftover"] == 0  # and nothing is left there after the utterance


# ---- lipstream serve at /edge/NAME/ --------------------------------------------------------------


@pytest.mark.browser
def test_serve_hosts_the_export_at_edge_name(avatars_root: Path, speech_wav, tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    wav, _ = speech_wav
    root = tmp_path / "avatars"
    shutil.copytree(avatars_root / "small", root / "small")
    server = ServerProcess(root)
    try:
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"{server.http}/edge/nobody/export.json")
        assert missing.value.code == 404 and b"unknown avatar" in missing.value.read()
        result = run_browser_script(
            "edge.mjs", {"url": f"{server.http}/edge/small/", "scenario": "play", "wav": str(wav)}, 240
        )
    finally:
        server.stop()
    assert [e["type"] for e in result["events"]][-1] == "playback_finished" and not result["errors"]
    assert (root / "small" / "cache" / "edge-viseme" / "export.json").is_file()  # built once, kept


def test_js_warp_matches_python_on_rounding_spread_and_f_v(small_avatar, tmp_path: Path) -> None:
    """The cues the page's audio-only engine never produces (f/v, strong rounding), and spread, warp as in
    Python (the lip shape's second pass included)."""
    import dataclasses
    import json
    import subprocess

    from lipstream.engines.viseme.engine import VisemeEngine
    from lipstream.engines.viseme.geometry import MouthGeometry
    from lipstream.engines.viseme.warp import render_patch

    engine = VisemeEngine(mouth="drawn")
    cache = engine._cache(small_avatar)
    fid = 2
    crop = np.asarray(cache.crops[fid])
    mask = np.asarray(small_avatar.masks[fid])
    rgba = np.concatenate([crop, mask[..., None]], axis=2).astype(np.uint8)
    (tmp_path / "crop.rgba").write_bytes(rgba.tobytes())
    rows = [[0.08, 0.15, 0.0, 1.0], [0.5, 0.0, 0.0, 0.6], [0.6, -0.9, 0.0, 0.0], [0.3, -0.5, 0.4, 0.0]]
    rows.append([0.4, 0.7, 0.0, 0.0])  # spread: corners out and up, lips thinner
    rows.append([0.0, 0.0, 1.0, 0.0])  # a pause: lips closed, the upper lip taking most of it
    # the second config lets only part of this source's lip gap ride (as on an open source mouth)
    for cfg in (engine.warp, dataclasses.replace(engine.warp, teeth_ride_max=0.1)):
        opts = {
            "crop": str(tmp_path / "crop.rgba"), "out": str(tmp_path / "out.rgba"), "size": crop.shape[0],
            "rows": rows, "geometry": cache.geometry[fid].tolist(), "cfg": dataclasses.asdict(cfg),
        }
        done = subprocess.run(
            ["node", str(Path(__file__).parent / "browser" / "warp_parity.mjs"), json.dumps(opts)],
            capture_output=True, text=True, timeout=60,
        )
        assert done.returncode == 0, done.stderr
        js = np.fromfile(tmp_path / "out.rgba", np.uint8).reshape(len(rows), *crop.shape[:2], 4)
        geo = MouthGeometry.unpack(cache.geometry[fid])
        inside = mask > 0
        for k, row in enumerate(rows):
            py = render_patch(crop, mask, geo, np.array(row, np.float32), cfg)
            assert _psnr(py[inside], crop[inside]) < 40.0, row  # the row really moved the mouth
            psnr = _psnr(js[k, ..., :3][inside], py[inside])
            print(f"{row} (ride ≤ {cfg.teeth_ride_max} W): JS vs Python {psnr:.1f} dB")
            assert psnr >= 45.0, (row, psnr)

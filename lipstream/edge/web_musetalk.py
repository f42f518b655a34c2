"""MuseTalk's part of a web export: checked ONNX graph folders, the avatar's latents and codebook seed."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from lipstream.avatar.bundle import CROP_SIZE, AvatarBundle
from lipstream.edge.web_config import ExportError, WebExportConfig
from lipstream.errors import AvatarError, ModelError
from lipstream.files import sha256_file
from lipstream.render.codebook import SimHashCodebook

log = logging.getLogger(__name__)


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


def write_musetalk(bundle: AvatarBundle, data: Path, config: WebExportConfig) -> dict[str, Any]:
    """MuseTalk's part of the export under data/musetalk/: the avatar's latents, the checked ONNX graphs (one
    folder per precision) and the codebook seed; the manifest's `musetalk` entry."""
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

"""`lipstream models download`: fetch MuseTalk's public weights in upstream layout (our only network use)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lipstream.engines.musetalk.layout import (
    MUSETALK_REPO,
    RECORD_FILE,
    UNET_FILES,
    VAE_DIR,
    VAE_FILES,
    VAE_REPO,
    VERSIONS,
    WHISPER_DIR,
    WHISPER_FILES,
    WHISPER_REPO,
)
from lipstream.errors import ModelError
from lipstream.files import atomic_file


@dataclass(frozen=True)
class DownloadItem:
    """One file: where it lives on the Hub and where it lands under models_dir."""

    repo_id: str
    filename: str  # path inside the Hub repo
    local_dir: Path  # hf_hub_download(local_dir=...) puts the file at local_dir / filename

    @property
    def dest(self) -> Path:
        """Where the file ends up."""
        return self.local_dir / self.filename


def plan_downloads(models_dir: Path, version: str = "all") -> list[DownloadItem]:
    """The files `lipstream models download --version VERSION` fetches, and where each one goes."""
    versions = VERSIONS if version == "all" else (version,)
    unknown = [v for v in versions if v not in UNET_FILES]
    if unknown:
        raise ModelError(f"unknown MuseTalk version '{version}'; choose 1.5, 1.0 or all")
    root = Path(models_dir)
    items = []
    for v in versions:
        files = UNET_FILES[v]
        items += [
            DownloadItem(MUSETALK_REPO, files.config_path, root),
            DownloadItem(MUSETALK_REPO, files.weights_path, root),
        ]
    items += [DownloadItem(VAE_REPO, name, root / VAE_DIR) for name in VAE_FILES]
    items += [DownloadItem(WHISPER_REPO, name, root / WHISPER_DIR) for name in WHISPER_FILES]
    return items


def human_size(n: int | None) -> str:
    """Bytes as a short human-readable size."""
    if n is None:
        return "size unknown"
    size = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{n} B"


def download(items: list[DownloadItem], models_dir: Path, say: Callable[[str], None] = print) -> dict:
    """Fetch every item with huggingface_hub (partial files resume); record sizes and hashes."""
    try:
        from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url
    except ImportError as exc:
        raise ModelError("huggingface_hub is not installed; install lipstream[musetalk]") from exc
    root = Path(models_dir)
    record_path = root / RECORD_FILE
    record = json.loads(record_path.read_text()) if record_path.is_file() else {"files": {}}
    for item in items:
        rel = os.path.relpath(item.dest, root)
        try:
            meta = get_hf_file_metadata(hf_hub_url(item.repo_id, item.filename))
            say(f"{item.repo_id}/{item.filename} -> {rel} ({human_size(meta.size)})")
            hf_hub_download(item.repo_id, item.filename, local_dir=item.local_dir)
        except Exception as exc:  # noqa: BLE001 - network, auth and offline errors all end here
            raise ModelError(
                f"could not fetch {item.repo_id}/{item.filename} from the Hugging Face Hub "
                f"({type(exc).__name__}: {str(exc)[:160]}); check the network "
                "(HF_ENDPOINT, HF_HUB_OFFLINE) and re-run — finished files are kept and partial ones resume"
            ) from exc
        size = item.dest.stat().st_size
        if meta.size is not None and size != meta.size:
            raise ModelError(
                f"{item.dest} is {size:,} bytes but the Hub lists {meta.size:,}; re-run to resume"
            )
        sha = meta.etag if meta.etag and len(meta.etag) == 64 else None  # LFS etags are the sha256
        record["files"][rel] = {"size": size, "sha256": sha, "repo": item.repo_id}
        root.mkdir(parents=True, exist_ok=True)
        with atomic_file(record_path, "w") as fh:
            fh.write(json.dumps(record, indent=2) + "\n")
    total = sum(f["size"] for f in record["files"].values())
    say(f"done: {len(items)} files, {human_size(total)} in {root}")
    return record

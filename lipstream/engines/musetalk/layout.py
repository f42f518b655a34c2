"""Where MuseTalk's weight files live: the upstream `models/` layout, per version.

Pure data (no torch): the loader, the download planner and the error messages share it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

VERSIONS = ("1.5", "1.0")
DOWNLOAD_COMMAND = "lipstream models download"
RECORD_FILE = "lipstream-weights.json"  # sizes and hashes written by the download command

MUSETALK_REPO = "TMElyralab/MuseTalk"
VAE_REPO = "stabilityai/sd-vae-ft-mse"
WHISPER_REPO = "openai/whisper-tiny"

VAE_DIR = "sd-vae"
WHISPER_DIR = "whisper"
VAE_FILES = ("config.json", "diffusion_pytorch_model.bin")
WHISPER_FILES = ("config.json", "pytorch_model.bin", "preprocessor_config.json")


@dataclass(frozen=True)
class UNetFiles:
    """The UNet config and state-dict file of one MuseTalk version, relative to models_dir."""

    version: str
    folder: str
    weights: str
    config: str = "musetalk.json"

    @property
    def config_path(self) -> str:
        """Relative path of musetalk.json."""
        return f"{self.folder}/{self.config}"

    @property
    def weights_path(self) -> str:
        """Relative path of the state dict."""
        return f"{self.folder}/{self.weights}"


UNET_FILES = {
    "1.5": UNetFiles(version="1.5", folder="musetalkV15", weights="unet.pth"),
    "1.0": UNetFiles(version="1.0", folder="musetalk", weights="pytorch_model.bin"),
}


def unet_files(version: str) -> UNetFiles:
    """The UNet files of a MuseTalk version ("1.5" or "1.0")."""
    from lipstream.errors import ModelError

    if version not in UNET_FILES:
        raise ModelError(f"unknown MuseTalk version '{version}'; choose one of: {', '.join(VERSIONS)}")
    return UNET_FILES[version]


@dataclass(frozen=True)
class ModelPaths:
    """Absolute paths of everything one MuseTalk version needs."""

    root: Path
    unet_config: Path
    unet_weights: Path
    vae_dir: Path
    whisper_dir: Path

    @classmethod
    def resolve(cls, root: Path, version: str) -> ModelPaths:
        """Paths under `root` for `version`, following the upstream layout."""
        files = unet_files(version)
        return cls(
            root=root,
            unet_config=root / files.config_path,
            unet_weights=root / files.weights_path,
            vae_dir=root / VAE_DIR,
            whisper_dir=root / WHISPER_DIR,
        )

    def required_files(self) -> list[Path]:
        """Every file the loader opens, in the order it opens them."""
        return [
            self.whisper_dir / "config.json",
            self.whisper_dir / "preprocessor_config.json",
            self.vae_dir / "config.json",
            self.unet_config,
            self.unet_weights,
        ]

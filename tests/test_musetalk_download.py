"""`lipstream models download`: what goes where (no network here), and a clear error when offline."""

from __future__ import annotations

from pathlib import Path

import pytest

from lipstream.cli import main
from lipstream.engines.musetalk.download import human_size, plan_downloads
from lipstream.engines.musetalk.layout import ModelPaths
from lipstream.errors import ModelError


def test_plan_follows_upstream_layout(tmp_path: Path) -> None:
    plan = plan_downloads(tmp_path, "1.5")
    where = {(i.repo_id, i.filename): i.dest.relative_to(tmp_path).as_posix() for i in plan}
    assert where == {
        ("TMElyralab/MuseTalk", "musetalkV15/musetalk.json"): "musetalkV15/musetalk.json",
        ("TMElyralab/MuseTalk", "musetalkV15/unet.pth"): "musetalkV15/unet.pth",
        ("stabilityai/sd-vae-ft-mse", "config.json"): "sd-vae/config.json",
        ("stabilityai/sd-vae-ft-mse", "diffusion_pytorch_model.bin"): "sd-vae/diffusion_pytorch_model.bin",
        ("openai/whisper-tiny", "config.json"): "whisper/config.json",
        ("openai/whisper-tiny", "pytorch_model.bin"): "whisper/pytorch_model.bin",
        ("openai/whisper-tiny", "preprocessor_config.json"): "whisper/preprocessor_config.json",
    }


@pytest.mark.parametrize("version", ["1.5", "1.0"])
def test_plan_covers_every_file_the_loader_opens(tmp_path: Path, version: str) -> None:
    dests = {i.dest for i in plan_downloads(tmp_path, "all")}
    paths = ModelPaths.resolve(tmp_path, version)
    assert set(paths.required_files()) <= dests
    assert paths.vae_dir / "diffusion_pytorch_model.bin" in dests
    assert paths.whisper_dir / "pytorch_model.bin" in dests


def test_plan_all_has_both_unets_once(tmp_path: Path) -> None:
    plan = plan_downloads(tmp_path, "all")
    dests = [i.dest for i in plan]
    assert len(dests) == len(set(dests)) == 9
    names = [i.filename for i in plan]
    assert "musetalk/pytorch_model.bin" in names and "musetalkV15/unet.pth" in names
    with pytest.raises(ModelError, match="unknown MuseTalk version '2'"):
        plan_downloads(tmp_path, "2")


def test_human_size() -> None:
    assert human_size(748) == "748 B"
    assert human_size(3_400_000_000) == "3.4 GB"
    assert human_size(None) == "size unknown"


def test_dry_run_lists_destinations(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["models", "download", "--models-dir", str(tmp_path), "--version", "1.0", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert f"TMElyralab/MuseTalk/musetalk/pytorch_model.bin -> {tmp_path}/musetalk/pytorch_model.bin" in out
    assert not any(tmp_path.iterdir())


def test_offline_download_fails_with_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    # conftest sets HF_HUB_OFFLINE=1: huggingface_hub itself refuses, nothing is faked
    assert main(["models", "download", "--models-dir", str(tmp_path / "m"), "--version", "1.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.startswith("error: could not fetch TMElyralab/MuseTalk/musetalkV15/musetalk.json")
    assert not (tmp_path / "m" / "musetalkV15" / "musetalk.json").exists()

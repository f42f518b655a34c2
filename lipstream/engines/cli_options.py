"""Engine selection flags shared by the commands that run an engine (render, serve, avatar ...)."""

from __future__ import annotations

import argparse

ENGINE_OPTION_NAMES = ("musetalk_version", "device", "dtype", "batch_size", "models_dir", "compile")


def add_engine_arguments(parser: argparse.ArgumentParser, with_engine: bool = True) -> None:
    """Engine selection flags shared by render, serve and avatar commands."""
    if with_engine:
        parser.add_argument(
            "--engine", default="viseme", choices=["viseme", "musetalk"], help="lip-sync engine"
        )
    parser.add_argument("--musetalk-version", default=None, choices=["1.5", "1.0"], help="MuseTalk weights")
    parser.add_argument("--device", default=None, help="musetalk: cuda or cpu (default: cuda if available)")
    parser.add_argument("--dtype", default=None, help="musetalk: float16 (CUDA), bfloat16 or float32 (CPU)")
    parser.add_argument("--batch-size", type=int, default=None, help="musetalk: frames per neural call")
    parser.add_argument("--models-dir", default=None, help="musetalk: weights folder")
    parser.add_argument(
        "--compile", action="store_true", default=None,
        help="musetalk: torch.compile the UNet and VAE (1.8x faster on an H200, 60-90 s at load)",
    )


def engine_options(args: argparse.Namespace) -> dict:
    """Engine keyword options given on the command line (unset ones left to the engine's defaults)."""
    if getattr(args, "engine", None) != "musetalk":
        return {}
    opts = {name: getattr(args, name) for name in ENGINE_OPTION_NAMES if getattr(args, name) is not None}
    if "musetalk_version" in opts:
        opts["version"] = opts.pop("musetalk_version")
    return opts

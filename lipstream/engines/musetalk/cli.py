"""`lipstream models ...`: fetch MuseTalk weights, and encode an avatar's MuseTalk latents."""

from __future__ import annotations

import argparse

from lipstream.paths import models_dir


def register(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """Add `lipstream models download` and `lipstream models latents`; the `models` subcommands."""
    models = subparsers.add_parser("models", help="neural engine weights (MuseTalk)")
    sub = models.add_subparsers(dest="models_command", metavar="ACTION")

    dl = sub.add_parser(
        "download", help="fetch MuseTalk v1.5/v1.0, sd-vae-ft-mse and whisper-tiny from the Hub"
    )
    dl.add_argument("--models-dir", help="target folder (default $LIPSTREAM_HOME/models)")
    dl.add_argument("--version", choices=["1.5", "1.0", "all"], default="all", help="which UNet(s) to fetch")
    dl.add_argument(
        "--dry-run", action="store_true", help="list what would be fetched and where, fetch nothing"
    )
    dl.set_defaults(func=_download)

    lat = sub.add_parser("latents", help="encode and store an avatar's MuseTalk VAE latents (once)")
    lat.add_argument("avatar", help="avatar name or bundle folder")
    lat.add_argument("--models-dir", help="MuseTalk models folder (default $LIPSTREAM_HOME/models)")
    lat.add_argument("--musetalk-version", choices=["1.5", "1.0"], default="1.5")
    lat.add_argument("--device", default="auto", help="cuda, cpu or auto")
    lat.add_argument("--dtype", default="auto", help="fp16 (CUDA), bf16, fp32 or auto")
    lat.set_defaults(func=_latents)
    models.set_defaults(func=lambda args: models.print_help() or 1)
    return sub


def _download(args: argparse.Namespace) -> int:
    from lipstream.engines.musetalk.download import download, plan_downloads

    root = models_dir(args.models_dir)
    items = plan_downloads(root, args.version)
    if args.dry_run:
        for item in items:
            print(f"{item.repo_id}/{item.filename} -> {item.dest}")
        return 0
    download(items, root)
    return 0


def _latents(args: argparse.Namespace) -> int:
    from lipstream.avatar.bundle import load_avatar
    from lipstream.engines.registry import create_engine

    bundle = load_avatar(args.avatar)
    engine = create_engine(
        "musetalk",
        models_dir=args.models_dir,
        version=args.musetalk_version,
        device=args.device,
        dtype=args.dtype,
        batch_size=1,
    )
    engine.prepare(bundle)
    entry = bundle.manifest.engines.get("musetalk", {})
    print(f"MuseTalk latents {entry.get('shape')} stored in {bundle.engine_dir('musetalk')}")
    return 0

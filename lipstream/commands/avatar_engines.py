"""`avatar prepare --engine X` and `avatar seed-codebook`: avatar commands that also need an engine."""

from __future__ import annotations

import argparse

from lipstream.avatar.bundle import AvatarBundle
from lipstream.avatar.cli import add_avatars_dir, prepare_from_args
from lipstream.engines.cli_options import add_engine_arguments, engine_options


def register(avatar_commands: argparse._SubParsersAction) -> None:
    """Give `avatar prepare` its engine options and add `avatar seed-codebook`."""
    prepare = avatar_commands.choices["prepare"]
    prepare.add_argument(
        "--engine", default=None, choices=["viseme", "musetalk"],
        help="also build this engine's caches now (musetalk: the VAE latents of every frame)",
    )  # fmt: skip
    add_engine_arguments(prepare, with_engine=False)
    prepare.set_defaults(func=run_prepare)

    seed = avatar_commands.add_parser(
        "seed-codebook", help="pre-fill an avatar's mouth-shape codebook from sample speech (acceleration)"
    )
    seed.add_argument("name", help="avatar name or bundle folder")
    seed.add_argument("--audio", nargs="+", required=True, help="speech files in the voice(s) it will speak")
    add_engine_arguments(seed)
    add_avatars_dir(seed)
    seed.set_defaults(func=run_seed_codebook)

    atlas = avatar_commands.add_parser(
        "atlas", help="build the weight-free engine's mouth atlas from the avatar's own frames now"
    )
    atlas.add_argument("name", help="avatar name or bundle folder")
    add_avatars_dir(atlas)
    atlas.set_defaults(func=run_atlas)


def run_prepare(args: argparse.Namespace) -> int:
    """`lipstream avatar prepare INPUT --name NAME [--engine X]`."""
    bundle = prepare_from_args(args)
    if args.engine:
        _prepare_engine_caches(args, bundle)
    return 0


def _prepare_engine_caches(args: argparse.Namespace, bundle: AvatarBundle) -> None:
    """Build the chosen engine's caches right away."""
    from lipstream.engines.registry import create_engine

    engine = create_engine(args.engine, **engine_options(args))
    engine.prepare(bundle)
    print(f"cached {args.engine} data in {bundle.engine_dir(args.engine)}")


def run_seed_codebook(args: argparse.Namespace) -> int:
    """Seed the codebook from speech files and print what it holds."""
    from lipstream.audio.decode import load_audio
    from lipstream.audio.speech import Speech
    from lipstream.avatar.bundle import load_avatar
    from lipstream.engines.registry import create_engine
    from lipstream.render.seed import seed_codebook

    bundle = load_avatar(args.name, args.avatars_dir)
    speeches = [Speech(pcm=load_audio(path), source=str(path)) for path in args.audio]
    engine = create_engine(args.engine, **engine_options(args))
    engine.prepare(bundle)
    result = seed_codebook(bundle, engine, speeches)
    print(
        f"seeded {result.path}: {result.entries} mouth shapes from {result.frames} frames of "
        f"{result.utterances} file(s) ({result.neural_frames} engine passes)"
    )
    return 0


def run_atlas(args: argparse.Namespace) -> int:
    """`lipstream avatar atlas NAME`: build the viseme caches and mouth atlas; say whether it is used."""
    from lipstream.avatar.bundle import load_avatar
    from lipstream.engines.viseme.engine import VisemeEngine

    bundle = load_avatar(args.name, args.avatars_dir)
    engine = VisemeEngine()
    engine.prepare(bundle)
    entry = bundle.manifest.engines["viseme"]["atlas"]
    print(
        f"mouth atlas of '{bundle.name}': {entry['units']} mouths from {entry['frames_used']}/"
        f"{entry['frames_total']} frames, {entry['bytes'] / 1e6:.1f} MB, coverage {entry['coverage']:.2f}; "
        + engine.mouth_source(bundle)
    )
    return 0

"""`lipstream avatar ...`: prepare, sample, list and info. Preparation does not depend on the live path:
the commands that also need an engine (`prepare --engine`, `seed-codebook`) are added by the command layer
above the rooms (lipstream.commands.avatar_engines)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from lipstream.avatar import bundle as bf
from lipstream.errors import AvatarError


def summary_line(bundle: bf.AvatarBundle, verb: str = "prepared") -> str:
    """One line for the user: frames, size, face width, time taken, where it is."""
    m = bundle.manifest
    fps_done = m.frame_count / m.prepare_seconds if m.prepare_seconds else 0.0
    seconds = m.frame_count / m.fps
    frames = f"{m.frame_count} frames ({seconds:.1f} s at {m.fps} fps)"
    if m.source_fps is None:  # a photo: alone, or with the pictures (or the breathing clip) made from it
        kind = "photo" if m.frame_count == 1 else f"photo -> {frames}"
    else:
        kind = frames
    return (
        f"{verb} avatar '{m.name}': {kind}, {m.width}×{m.height}, face {m.face_width_px:.0f} px wide, "
        f"in {m.prepare_seconds:.1f} s ({fps_done:.1f} frames/s) -> {bundle.path}"
    )


def stages_line(bundle: bf.AvatarBundle) -> str:
    """'  time: tracking 2.1 s, encoding 1.3 s, ...': where the prepare's time went ('' when not recorded)."""
    from lipstream.avatar.stage_times import PrepareTimes

    stages = bundle.manifest.prepare_stages
    return f"  time: {PrepareTimes.from_entry(stages).line()}" if stages else ""


def _print_notes(bundle: bf.AvatarBundle) -> None:
    for note in bundle.manifest.notes:
        print(f"note: {note}")


def prepare_from_args(args: argparse.Namespace) -> bf.AvatarBundle:
    """Prepare the bundle `avatar prepare` asks for and print what was made."""
    from lipstream.avatar.blink import BlinkConfig
    from lipstream.avatar.breathing import BreathingConfig
    from lipstream.avatar.prepare import PrepareConfig, prepare_avatar

    config = PrepareConfig(
        blink=BlinkConfig(enabled=not getattr(args, "no_blink", False)),
        breathing=BreathingConfig(enabled=not getattr(args, "still", False)),
    )
    bundle = prepare_avatar(
        args.input, args.name, avatars_root=args.avatars_dir, force=args.force, progress=not args.quiet,
        config=config,
    )  # fmt: skip
    _print_notes(bundle)
    print(summary_line(bundle))
    if stages_line(bundle):
        print(stages_line(bundle))
    return bundle


def run_prepare(args: argparse.Namespace) -> int:
    """`lipstream avatar prepare INPUT --name NAME`."""
    prepare_from_args(args)
    return 0


def run_sample(args: argparse.Namespace) -> int:
    """`lipstream avatar sample`: build (or keep) the sample avatar."""
    from lipstream.avatar.sample import build_sample_avatar

    force = args.force
    if args.skip_existing and not force and bf.bundle_path(args.name, args.avatars_dir).exists():
        try:
            existing = bf.load_avatar(bf.bundle_path(args.name, args.avatars_dir))
        except AvatarError as exc:
            raise AvatarError(f"{exc} (found while checking --skip-existing; rerun with --force)") from exc
        where = f"avatar '{args.name}' at {existing.path}"
        if existing.manifest.blinks_planned:
            print(f"{where} already exists ({existing.frame_count} frames); kept")
            return 0
        # made by this command, from nothing the user gave: rebuilt rather than kept without blinks
        print(f"{where} was built before blinks were drawn; building it again")
        force = True
    bundle = build_sample_avatar(
        args.name, avatars_root=args.avatars_dir, force=force, progress=not args.quiet,
        seconds=args.seconds,
    )
    _print_notes(bundle)
    print(summary_line(bundle, verb="built sample"))
    if stages_line(bundle):
        print(stages_line(bundle))
    return 0


def run_list(args: argparse.Namespace) -> int:
    """`lipstream avatar list`."""
    names = bf.list_avatars(args.avatars_dir)
    if not names:
        print(f"no avatars in {bf.avatars_dir(args.avatars_dir)}; make one with `lipstream avatar sample`")
        return 0
    for name in names:
        try:
            m = bf.load_avatar(name, args.avatars_dir).manifest
            print(f"{name}\t{m.frame_count} frames\t{m.width}×{m.height}\tface {m.face_width_px:.0f} px")
        except AvatarError as exc:
            print(f"{name}\tunreadable: {exc}")
    return 0


def run_upgrade(args: argparse.Namespace) -> int:
    """`lipstream avatar upgrade NAME`: format 1 -> format 2, in place."""
    from lipstream.avatar.upgrade import upgrade_avatar

    print(upgrade_avatar(args.name, args.avatars_dir, progress=not args.quiet).line())
    return 0


def avatar_info(bundle: bf.AvatarBundle) -> dict:
    """What `avatar info --json` prints: the manifest plus the bundle's path and array shapes."""
    arrays = {
        "frames": bundle.frames, "boxes": bundle.boxes, "landmarks": bundle.landmarks,
        "masks": bundle.masks, "nose_base": bundle.nose_base, "idle_loop": bundle.idle_loop,
    }
    return {
        **bundle.manifest.model_dump(),
        "path": str(bundle.path),
        "arrays": {k: {"shape": list(v.shape), "dtype": str(v.dtype)} for k, v in arrays.items()},
    }


def run_info(args: argparse.Namespace) -> int:
    """`lipstream avatar info NAME [--json]`."""
    bundle = bf.load_avatar(args.name, args.avatars_dir)
    info = avatar_info(bundle)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    m = bundle.manifest
    box_w = bundle.boxes[:, 2] - bundle.boxes[:, 0]
    box_h = bundle.boxes[:, 3] - bundle.boxes[:, 1]
    print(f"avatar '{m.name}' at {bundle.path} (bundle format {m.format_version})")
    print(f"  source   {m.source_file}, {m.width}×{m.height}, source fps {m.source_fps or 'photo'}")
    print(f"  frames   {m.frame_count} at {m.fps} fps, idle loop {len(bundle.idle_loop)} frames")
    if m.prepare_stages:
        print(f"  prepare  {m.prepare_seconds:.1f} s:{stages_line(bundle).removeprefix('  time:')}")
    if m.idle:
        print(f"  idle     {m.idle.get('reason', '')}")
        blinks = m.idle.get("blinks")
        if blinks:
            own, drawn, rate = blinks["own"], blinks["drawn"], blinks["per_minute"]
            print(f"  blinks   {own} of its own, {drawn} drawn, per loop ({rate}/min)")
    blink_note = m.blink_note()
    if blink_note:
        print(f"  note     {blink_note}")
    if m.format_version < bf.FORMAT_VERSION:
        upgrade = f"`lipstream avatar upgrade {m.name}` makes it ~100x smaller"
        print(f"  note     raw frames (bundle format {m.format_version}): {upgrade}")
    print(f"  face     {m.face_width_px:.0f} px wide, mean crop box {box_w.mean():.0f}×{box_h.mean():.0f} px")
    print(f"  model    {m.landmark_model}")
    print(f"  engines  {', '.join(m.engines) or 'none cached yet'}")
    atlas = m.engines.get("viseme", {}).get("atlas")
    if atlas:
        use = "used" if atlas["usable"] else f"not used, drawn mouth instead: {atlas['reason']}"
        print(
            f"  atlas    {atlas['units']} filmed mouths, coverage {atlas['coverage']:.2f}, "
            f"{atlas['bytes'] / 1e6:.1f} MB ({use})"
        )
    for note in m.notes:
        print(f"  note     {note}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> argparse._SubParsersAction:
    """Add `lipstream avatar prepare|sample|list|upgrade|info`; returns the `avatar` subcommands, for the
    command layer to add those that combine rooms."""
    avatar = subparsers.add_parser("avatar", help="prepare and inspect avatars")
    sub = avatar.add_subparsers(dest="avatar_command", metavar="ACTION", required=True)

    common = add_avatars_dir
    p = sub.add_parser("prepare", help="turn a presenter video (or photo) into an avatar bundle")
    p.add_argument("input", help="a video file (any container/codec FFmpeg reads) or an image")
    p.add_argument("--name", required=True, help="avatar name (folder name under the avatars folder)")
    p.add_argument("--force", action="store_true", help="replace an existing avatar of that name")
    p.add_argument(
        "--no-blink", action="store_true", help="draw no blinks (footage that never blinks stays so)"
    )
    p.add_argument(
        "--still", action="store_true",
        help="a photo stays still (no breathing clip: 4 frames instead of 300, a far smaller web export)",
    )  # fmt: skip
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    common(p)
    p.set_defaults(func=run_prepare)

    p = sub.add_parser("sample", help="build the sample avatar (astronaut with head motion; no download)")
    p.add_argument("--name", default="sample", help="avatar name (default: sample)")
    p.add_argument("--seconds", type=float, default=8.0, help="length of the sample clip (default 8)")
    p.add_argument("--force", action="store_true", help="replace an existing avatar of that name")
    p.add_argument("--skip-existing", action="store_true", help="keep a complete existing avatar and say so")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    common(p)
    p.set_defaults(func=run_sample)

    p = sub.add_parser("list", help="list prepared avatars")
    common(p)
    p.set_defaults(func=run_list)

    p = sub.add_parser(
        "upgrade", help="rewrite a bundle of format 1 (raw frames, ~6 MB a frame) as format 2, in place"
    )
    p.add_argument("name", help="avatar name or bundle folder")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    common(p)
    p.set_defaults(func=run_upgrade)

    p = sub.add_parser("info", help="describe one avatar")
    p.add_argument("name", help="avatar name or bundle folder")
    p.add_argument("--json", action="store_true", help="print the manifest and array shapes as JSON")
    common(p)
    p.set_defaults(func=run_info)
    return sub


def add_avatars_dir(parser: argparse.ArgumentParser) -> None:
    """The `--avatars-dir` option every avatar command takes."""
    parser.add_argument(
        "--avatars-dir", type=Path, default=None, help="avatars folder (default $LIPSTREAM_HOME/avatars)"
    )

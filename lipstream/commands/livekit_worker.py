"""`lipstream livekit-worker`: the LiveKit avatar worker (agents send it into their rooms over HTTP)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from lipstream.errors import LipstreamError

MISSING_EXTRA = "the LiveKit avatar worker needs livekit-agents: pip install 'lipstream[livekit]'"


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `lipstream livekit-worker`."""
    p = subparsers.add_parser(
        "livekit-worker",
        help="run the LiveKit avatar worker: agents (lipstream.integrations.livekit.AvatarSession) send "
        "it into their rooms, where it speaks their audio with the avatar's face",
    )
    p.add_argument(
        "--url", default=os.environ.get("LIVEKIT_URL"), help="LiveKit server URL (env LIVEKIT_URL)"
    )
    p.add_argument("--api-key", default=os.environ.get("LIVEKIT_API_KEY"), help="env LIVEKIT_API_KEY")
    p.add_argument(
        "--api-secret", default=os.environ.get("LIVEKIT_API_SECRET"), help="env LIVEKIT_API_SECRET"
    )
    p.add_argument(
        "--avatar", required=True, help="prepared avatar played by default (name or bundle folder)"
    )
    p.add_argument("--engine", default="viseme", choices=["viseme", "musetalk"], help="lip-sync engine")
    p.add_argument("--output-width", type=int, default=None, help="scale the video down to this width")
    p.add_argument(
        "--sample-rate", type=int, default=24_000,
        help="rate of the agent's audio and of the published audio track (default 24000; the agent's "
        "AvatarSession(sample_rate=) must match)",
    )  # fmt: skip
    p.add_argument("--host", default="127.0.0.1", help="interface the /launch endpoint listens on")
    p.add_argument("--port", type=int, default=8089, help="port of the /launch endpoint (default 8089)")
    p.set_defaults(func=run_worker)


def run_worker(args: argparse.Namespace) -> int:
    """Check the setup, then serve /launch until interrupted."""
    try:
        from lipstream.integrations.livekit.dispatch import AvatarDispatcher, WorkerSettings
    except ImportError as exc:
        raise LipstreamError(MISSING_EXTRA) from exc
    from lipstream.avatar.bundle import load_avatar

    missing = [flag for flag, value in (("--url", args.url), ("--api-key", args.api_key),
                                        ("--api-secret", args.api_secret)) if not value]  # fmt: skip
    if missing:
        raise LipstreamError(
            f"livekit-worker needs {', '.join(missing)} (or LIVEKIT_URL, LIVEKIT_API_KEY, "
            "LIVEKIT_API_SECRET): the LiveKit server it joins and the key pair that verifies the agents' "
            "launch tokens"
        )
    if args.sample_rate <= 0:
        raise LipstreamError(f"--sample-rate must be positive (got {args.sample_rate})")
    load_avatar(args.avatar)  # an unknown avatar stops here, with the names that exist
    settings = WorkerSettings(
        url=args.url, api_key=args.api_key, api_secret=args.api_secret, avatar=args.avatar,
        engine=args.engine, output_width=args.output_width, audio_sample_rate=args.sample_rate,
    )  # fmt: skip
    signum = asyncio.run(_serve(AvatarDispatcher(settings), args.host, args.port))
    print("terminated" if signum == signal.SIGTERM else "interrupted", file=sys.stderr)
    return 128 + signum  # the shell's convention: 143 after SIGTERM, 130 after Ctrl-C


async def _serve(dispatcher, host: str, port: int) -> int:
    """Serve until SIGTERM or Ctrl-C, then stop every room and the HTTP server; returns the signal."""
    from lipstream.integrations.livekit.dispatch import serve_dispatcher

    # The signal only sets a future: an exception raised into the loop from a Python signal handler
    # can land inside aiohttp's own callbacks and leave its shutdown waiting forever (seen in CI).
    loop = asyncio.get_running_loop()
    stopped: asyncio.Future[int] = loop.create_future()
    stops = (signal.SIGTERM, signal.SIGINT)
    for signum in stops:
        loop.add_signal_handler(signum, lambda s=signum: stopped.done() or stopped.set_result(s))
    try:
        runner = await serve_dispatcher(dispatcher, host, port)
        print(
            f"lipstream avatar worker: POST http://{host}:{port}/launch (LiveKit {dispatcher.settings.url})",
            flush=True,
        )
        try:
            return await stopped
        finally:
            await runner.cleanup()
    finally:
        for signum in stops:
            loop.remove_signal_handler(signum)

"""`lipstream client`: the reference client (speak, or `--converse` one spoken question) and its report."""

from __future__ import annotations

import argparse
import asyncio
import json
import os

from lipstream.errors import LipstreamError


def bearer_token(args: argparse.Namespace) -> str | None:
    """The bearer token: --token, else $LIPSTREAM_TOKEN, else none."""
    return args.token or os.environ.get("LIPSTREAM_TOKEN") or None


def run_client_command(args: argparse.Namespace) -> int:
    """Run the reference client and print its report."""
    from lipstream.server.client import run_client

    url = args.url if args.url.rstrip("/").endswith("/ws") else args.url.rstrip("/") + "/ws"
    if not url.startswith(("ws://", "wss://")):
        raise LipstreamError(f"--url must start with ws:// or wss:// (got {args.url})")
    if args.converse is not None:
        return _run_converse(args, url)
    report = asyncio.run(
        run_client(
            url,
            args.avatar,
            text=args.text,
            audio=args.audio,
            out=args.out,
            token=bearer_token(args),
            output_width=args.width,
            timeout=args.timeout,
            audio_codec="opus" if args.opus else "pcm",
        )
    )
    text = report.model_dump_json(indent=2)
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text + "\n")
    summary = {
        k: getattr(report, k)
        for k in (
            "ttff_ms", "frames_received", "speech_frames", "pts_continuous", "duration_seconds",
            "audio_codec", "out",
        )  # fmt: skip
    }
    print(json.dumps(summary))
    return 0


def _run_converse(args: argparse.Namespace, url: str) -> int:
    """`client --converse`: one spoken question, its answer recorded; print a summary, write the report."""
    from lipstream.server.converse_client import run_converse

    report = asyncio.run(
        run_converse(
            url, args.avatar, args.converse, out=args.out, token=bearer_token(args), output_width=args.width,
            timeout=args.timeout,
        )
    )  # fmt: skip
    if args.report is not None:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(report.model_dump_json(indent=2) + "\n")
    summary = {
        k: getattr(report, k)
        for k in ("final_transcript", "reply", "end_rule", "end_score", "speech_end_to_first_frame_ms",
                  "end_of_turn_to_first_frame_ms", "frames_recorded", "out")
    }  # fmt: skip
    summary["turn_metrics_ms"] = (report.turn_metrics or {}).get("ms")
    print(json.dumps(summary))
    return 0

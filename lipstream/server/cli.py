"""`lipstream serve` (the live server and page) and `lipstream client` (the reference client)."""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from lipstream.engines.cli_options import add_engine_arguments, engine_options
from lipstream.errors import LipstreamError
from lipstream.server.client_command import bearer_token, run_client_command

log = logging.getLogger(__name__)


# a conversation setting's command-line flag, where it is not the field's own name
FLAG_OF = {"end_silence_ms": "end-of-turn-ms", "streaming_recognition": "streaming-stt"}


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `serve` and `client`."""
    serve = subparsers.add_parser("serve", help="serve the live player page and the WebSocket session API")
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0 picks a free one)")
    add_engine_arguments(serve)
    serve.add_argument(
        "--token", default=None, help="bearer token required on /ws and /api (env LIPSTREAM_TOKEN)"
    )
    serve.add_argument("--avatars-dir", type=Path, default=None, help="folder of avatar bundles")
    serve.add_argument("--voice", default="piper", help="TTS voice for speak requests (default piper)")
    serve.add_argument(
        "--workers", type=int, default=None,
        help="server processes sharing the port, each with its own engine (default: the usable cores for "
        "the viseme engine, 1 for musetalk and --agent; 1: one process, as before)",
    )
    serve.add_argument(
        "--max-sessions", type=int, default=8, help="concurrent sessions, whole server (default 8)"
    )
    serve.add_argument("--max-message-mb", type=float, default=8.0, help="largest message in MiB (default 8)")
    serve.add_argument(
        "--max-upload-seconds", type=float, default=120.0, help="longest upload (default 120 s)"
    )
    serve.add_argument(
        "--max-connections", type=int, default=64,
        help="open TCP connections at most, whole server (default 64)",
    )
    serve.add_argument(
        "--header-timeout", type=float, default=10.0,
        help="seconds a client has to send a whole HTTP request head (default 10)",
    )
    batching = serve.add_argument_group("musetalk: engine passes pooled across sessions (a batcher per GPU)")
    batching.add_argument(
        "--batch-sizes", type=int, nargs="+", default=[4, 8, 16, 32], metavar="N",
        help="the only batch sizes a pass runs at (each built and warmed before the server is ready; "
        "default 4 8 16 32)",
    )
    batching.add_argument(
        "--max-batch-wait-ms", type=float, default=40.0,
        help="how long a pass may wait for other sessions' frames after its first, when no deadline is near "
        "(default 40 ms)",
    )
    batching.add_argument(
        "--no-batching", dest="batching", action="store_false",
        help="each session calls the engine on its own (the per-session path, for comparison)",
    )
    serve.add_argument(
        "--no-patch-stream", action="store_true",
        help="offer whole frames only: refuse hello.stream=patch (the page then asks for full frames)",
    )
    serve.add_argument(
        "--patch-kbps", type=float, default=150.0,
        help="cap of each patch-mode session's mouth video in kbit/s (default 150: ~39 dB on the mouth; the "
        "whole session with Opus audio stays under 200 kbit/s)",
    )
    # the conversation's defaults come from its config classes (one home each); no model is loaded
    from lipstream.talk.conversation_types import ConversationConfig
    from lipstream.talk.hearing.stt import BEAM_SIZE
    from lipstream.talk.seats import DEFAULT_IDLE_SECONDS, DEFAULT_MAX_WAITING
    from lipstream.talk.turn_rule import DEFAULT_THRESHOLDS, DEFAULT_UNSURE_SHARES, TurnEndConfig

    talk, turn = ConversationConfig(), TurnEndConfig()
    agent = serve.add_argument_group("conversation (the avatar listens and answers)")
    agent.add_argument("--agent", action="store_true", help="sessions may ask for a conversation (Talk mode)")
    agent.add_argument(
        "--llm-url", default=None,
        help="OpenAI-compatible endpoint (Ollama, vLLM, llama.cpp server, hosted); key from "
        "$LIPSTREAM_LLM_KEY. Default: the embedded SmolLM2-135M, offline",
    )
    agent.add_argument("--llm-model", default="default", help="model name sent to --llm-url")
    agent.add_argument(
        "--llm-read-ahead", choices=["auto", "on", "off"], default="auto",
        help="send --llm-url the question as heard so far (one token each) while the user speaks, so its "
        "prompt cache holds it at the pause; auto: only an endpoint on this machine",
    )
    agent.add_argument(
        "--stt-model", type=Path, default=None, metavar="DIR",
        help="speech recognition from a CTranslate2 Whisper folder of yours (faster-whisper's format, e.g. "
        "small.en) instead of the bundled tiny.en",
    )
    agent.add_argument(
        "--stt-url", default=None,
        help="speech recognition from an OpenAI-compatible /v1/audio/transcriptions endpoint (key from "
        "$LIPSTREAM_STT_KEY); --stt-url-model names the model",
    )
    agent.add_argument("--stt-url-model", default="whisper-1", help="model name sent to --stt-url")
    agent.add_argument(
        "--streaming-stt", action="store_true",
        help="commit stable words while the user speaks and decode only each turn's tail at the end "
        "(docs/conversation.md; off: every decode reads the whole turn)",
    )
    agent.add_argument(
        "--stt-window", choices=["audio", "full"], default="audio",
        help="audio: Whisper's encoder reads the turn's own length (at least 5 s; ~2x faster on 2 cores); "
        "full: its fixed 30 s window, as Whisper was trained (docs/conversation.md)",
    )
    agent.add_argument(
        "--stt-beam", type=int, default=BEAM_SIZE,
        help="Whisper's beam search width, 1 for greedy (default %(default)s; 5: fewer misheard words in "
        "some voices, 35-60 ms more a transcript; docs/benchmarks.md)",
    )
    agent.add_argument("--system-prompt", default=None, help="the persona: TEXT or @FILE")
    agent.add_argument(
        "--knowledge", type=Path, default=None, metavar="PATH",
        help="answer from these documents: a Markdown / text file or a folder of them (indexed once, "
        "re-indexed when a file changes; docs/knowledge.md)",
    )
    agent.add_argument(
        "--persona", type=Path, default=None, metavar="FILE",
        help="who the avatar is: a TOML file with name, greeting, instructions, voice, language",
    )
    agent.add_argument(
        "--max-reply-tokens", type=int, default=talk.max_reply_tokens,
        help=f"longest answer in tokens (default {talk.max_reply_tokens})",
    )
    agent.add_argument(
        "--no-echo-cancel", dest="echo_cancel", action="store_false",
        help="use the microphone as it comes (headsets; by default the avatar's own voice is cancelled)",
    )
    agent.add_argument(
        "--turn-detector", choices=["text", "smart-turn", "silence"], default="text",
        help="what decides that the user has finished: text (the pause's transcript judged by the embedded "
        "SmolLM2; default), smart-turn (the Smart Turn v3.2 audio model: `lipstream models turn` installs "
        "it) or silence (--end-of-turn-ms of silence)",
    )
    agent.add_argument(
        "--turn-threshold", type=float, default=None,
        help="a detector score at or above this ends the turn (default: "
        + ", ".join(f"{v:g} {k}" for k, v in DEFAULT_THRESHOLDS.items()) + ")",
    )
    timings = (  # the end-of-turn rule's lengths, their defaults from TurnEndConfig
        ("--turn-finished-ms", turn.finished_ms, "silence before a turn the detector judged finished is "
         "answered"),
        ("--turn-max-wait-ms", turn.max_wait_ms, "silence that ends a turn the detector judged unfinished: "
         "the hard cap"),
        ("--turn-unsure-ms", turn.unsure_ms, "silence that ends a turn whose score is under the threshold "
         "but at least --turn-unsure-share of it"),
    )  # fmt: skip
    for flag, default, text in timings:
        agent.add_argument(flag, type=float, default=default, help=f"{text} (default {default:g} ms)")
    agent.add_argument(
        "--turn-unsure-share", type=float, default=None,
        help="see --turn-unsure-ms; 0 turns that rule off (default: "
        + ", ".join(f"{v:g} {k}" for k, v in DEFAULT_UNSURE_SHARES.items()) + ")",
    )
    seats = (  # conversations answered at once, the line beyond them, an unused seat (docs/scaling.md)
        ("--max-conversations", int, "one per CPU core", "seats: whole-frame conversations answered at once; "
         "one on the page's patch stream takes half a seat (measured: docs/benchmarks.md); more wait in "
         "line, told so"),
        ("--max-waiting", int, DEFAULT_MAX_WAITING, "visitors who may wait in line; more are refused"),
        ("--seat-idle-seconds", float, DEFAULT_IDLE_SECONDS, "a conversation unused this long gives its seat "
         "to a visitor in line who asks something"),
    )  # fmt: skip
    for flag, kind, default, text in seats:  # a default in words is the config's own (None here)
        value = default if isinstance(default, int | float) else None
        agent.add_argument(flag, type=kind, default=value, help=f"{text} (default {default})")
    agent.add_argument(
        "--end-of-turn-ms", type=float, default=talk.end_silence_ms,
        help="with --turn-detector silence: the silence that ends the user's turn "
        f"(default {talk.end_silence_ms:g} ms)",
    )
    scale = serve.add_argument_group("scale out over a Ray Serve cluster (pip install 'lipstream[ray]')")
    scale.add_argument(
        "--ray", action="store_true",
        help="serve through Ray Serve: replicas warmed before traffic, autoscaled on live sessions",
    )
    scale.add_argument(
        "--ray-address", default=None,
        help="auto (the cluster this machine joined), ray://HOST:10001 or HOST:6379; "
        "default: a local cluster bound to 127.0.0.1",
    )
    scale.add_argument(
        "--min-replicas", type=int, default=1, help="replicas kept when idle (default 1; 0 allowed)"
    )
    scale.add_argument("--max-replicas", type=int, default=2, help="replicas at most (default 2)")
    scale.add_argument(
        "--sessions-per-replica", type=int, default=None,
        help="live sessions a replica takes at most (default 4; --agent: its seats + line, docs/scaling.md)",
    )
    scale.add_argument(
        "--target-sessions", type=float, default=None,
        help="live sessions a replica the autoscaler aims for (default 3/4 of the above; --agent: its seats)",
    )
    scale.add_argument(
        "--downscale-delay", type=float, default=60.0,
        help="seconds of lower load before a replica is removed (default 60)",
    )
    scale.add_argument(
        "--cpus-per-replica", type=float, default=1.0, help="CPUs Ray reserves per replica (default 1)"
    )
    scale.add_argument(
        "--gpus-per-replica", type=float, default=0.0,
        help="GPUs per replica, fractions allowed (e.g. 0.5: two replicas share one GPU; default 0)",
    )
    serve.set_defaults(func=run_serve)

    client = subparsers.add_parser(
        "client", help="reference client: speak over a server, record what comes back"
    )
    client.add_argument("--url", required=True, help="ws://HOST:PORT/ws (the /ws path is added when missing)")
    client.add_argument("--avatar", required=True, help="avatar name on the server")
    what = client.add_mutually_exclusive_group(required=True)
    what.add_argument("--text", help="text to speak (server-side TTS)")
    what.add_argument("--audio", type=Path, help="audio file to upload and speak")
    what.add_argument(
        "--converse", type=Path, metavar="QUESTION.wav",
        help="ask an agent server (serve --agent) this recorded question as a live microphone would; "
        "record the answer and report transcripts, reply and turn latencies",
    )
    client.add_argument("--out", type=Path, required=True, help="MP4 of the received video and audio")
    client.add_argument("--report", type=Path, default=None, help="write the JSON report here")
    client.add_argument("--token", default=None, help="bearer token (env LIPSTREAM_TOKEN)")
    client.add_argument("--width", type=int, default=None, help="ask for a smaller stream of this width")
    client.add_argument(
        "--opus", action="store_true",
        help="ask for the audio as Opus (protocol 1.3; decoded here, the MP4 still gets AAC)",
    )
    client.add_argument(
        "--timeout", type=float, default=120.0,
        help="give up after this many seconds (with --converse: counted from the question's end)",
    )
    client.set_defaults(func=run_client_command)


def run_serve(args: argparse.Namespace) -> int:
    """Start uvicorn with one shared engine, or `--workers N` processes each with its own."""
    from lipstream.server.app import create_app
    from lipstream.server.config import MIB, Limits, ServerConfig
    from lipstream.server.launch import load_serving, uvicorn_server
    from lipstream.talk.agent import load_agent

    if args.max_sessions < 1 or args.max_message_mb <= 0 or args.max_upload_seconds <= 0:
        raise LipstreamError("--max-sessions, --max-message-mb and --max-upload-seconds must be positive")
    if args.header_timeout <= 0:
        raise LipstreamError("--header-timeout must be positive")
    if not args.agent and (args.knowledge is not None or args.persona is not None):
        raise LipstreamError("--knowledge and --persona are for a conversation: add --agent")
    if args.max_connections < args.max_sessions + 2:
        raise LipstreamError("--max-connections must leave room for every session and a page load or two")
    if args.avatars_dir is not None and not args.avatars_dir.is_dir():
        raise LipstreamError(f"--avatars-dir {args.avatars_dir} is not a folder")
    limit_bytes = max(1024, int(args.max_message_mb * MIB))
    limits = Limits(
        max_sessions=args.max_sessions,
        max_message_bytes=limit_bytes,
        max_upload_bytes=limit_bytes,
        max_upload_seconds=args.max_upload_seconds,
        max_pending_seconds=max(180.0, args.max_upload_seconds),
        max_connections=args.max_connections,
        header_timeout_seconds=args.header_timeout,
    )
    if not 16 <= args.patch_kbps <= 10_000:
        raise LipstreamError(f"--patch-kbps must be between 16 and 10000 (got {args.patch_kbps:g})")
    if min(args.batch_sizes) < 1 or args.max_batch_wait_ms < 0:
        raise LipstreamError("--batch-sizes must be positive and --max-batch-wait-ms at least 0")
    config = ServerConfig(
        host=args.host,
        port=args.port,
        engine=args.engine,
        token=bearer_token(args),
        avatars_dir=args.avatars_dir,
        voice=args.voice,
        limits=limits,
        stream_modes=("full",) if args.no_patch_stream else ("full", "patch"),
        patch_bitrate=round(args.patch_kbps * 1000),
        batching=args.batching,
        batch_sizes=tuple(args.batch_sizes),
        max_batch_wait_ms=args.max_batch_wait_ms,
    )
    _warn_of_unblinking_avatars(config.avatars_dir)
    if args.ray:
        if args.workers is not None:
            log.warning("--workers is ignored with --ray: Ray Serve's replicas are the processes")
        return _run_ray(args, config)
    workers = _worker_count(args)
    if workers > 1:
        from lipstream.server.workers import run_workers

        return run_workers(config, engine_options(args), workers)
    loaded = load_serving(config, engine_options(args))
    if config.engine != "viseme":  # every avatar's neural caches made now, not in a first session's wait
        from lipstream.server.warmup import warm_up

        warm_up(loaded.engine, config.avatars_dir)
    agent = load_agent(_agent_config(args)) if args.agent else None
    app = create_app(
        config, loaded.engine, loaded.factory, heap=loaded.heap, agent=agent, metrics=loaded.metrics
    )
    server = uvicorn_server(app, config)
    try:
        return asyncio.run(_serve(server, config))
    finally:
        if agent is not None:  # stops the language model's process (it would also die with us)
            asyncio.run(agent.aclose())


def _worker_count(args: argparse.Namespace) -> int:
    """How many server processes: --workers, else the usable cores; one where N would cost N models."""
    from lipstream.threads import usable_cores

    if args.workers is not None and args.workers < 1:
        raise LipstreamError("--workers must be at least 1")
    if args.agent:  # each worker would start its own language model process: one server, one model
        if args.workers is not None and args.workers > 1:
            log.warning(
                "--agent serves from one process (one language model): --workers %d ignored", args.workers
            )
        return 1
    if args.workers is not None:
        return args.workers
    return 1 if args.engine == "musetalk" else usable_cores()  # one neural model (and batcher) per GPU


def _run_ray(args: argparse.Namespace, config) -> int:
    """`serve --ray`: the same app in Ray Serve replicas (Ray is imported only on this path)."""
    from pydantic import ValidationError

    from lipstream.server.ray_serve import RayOptions, for_conversations, run_ray_serve

    address = args.ray_address
    if address is not None and address != "auto" and ":" not in address:
        raise LipstreamError(f"--ray-address must be auto, ray://HOST:PORT or HOST:PORT (got {address})")
    given = {"sessions_per_replica": args.sessions_per_replica, "target_sessions": args.target_sessions}
    try:
        options = RayOptions(
            address=args.ray_address, min_replicas=args.min_replicas, max_replicas=args.max_replicas,
            cpus_per_replica=args.cpus_per_replica, gpus_per_replica=args.gpus_per_replica,
            downscale_delay_s=args.downscale_delay, **{k: v for k, v in given.items() if v is not None},
        )  # fmt: skip
    except ValidationError as exc:
        first = exc.errors()[0]
        where = f"--{str(first['loc'][0]).replace('_', '-')}: " if first["loc"] else ""
        raise LipstreamError(f"{where}{first['msg'].removeprefix('Value error, ')}") from None
    agent = _agent_config(args) if args.agent else None
    if agent is not None:
        options, agent = for_conversations(options, agent)
    # a replica's own cap is Serve's (max_ongoing_requests): beyond it the proxy queues, it does not refuse
    limits = config.limits.model_copy(update={"max_sessions": options.sessions_per_replica})
    config = config.model_copy(update={"limits": limits})
    return run_ray_serve(config, options, engine_options(args), agent)


def _agent_config(args: argparse.Namespace):
    """The conversation's settings from the command line (checked; nothing loaded yet)."""
    from pydantic import ValidationError

    from lipstream.talk.agent import AgentConfig, read_system_prompt

    options = {
        "llm_url": args.llm_url,
        "llm_model": args.llm_model,
        "llm_read_ahead": args.llm_read_ahead,
        "stt_model": args.stt_model.expanduser().resolve() if args.stt_model else None,
        "stt_url": args.stt_url,
        "stt_url_model": args.stt_url_model,
        "stt_window": args.stt_window,
        "stt_beam": args.stt_beam,
        "echo_cancel": args.echo_cancel,
        "max_conversations": args.max_conversations,
        "max_waiting": args.max_waiting,
        "seat_idle_seconds": args.seat_idle_seconds,
    }
    conversation: dict = {
        "max_reply_tokens": args.max_reply_tokens, "end_silence_ms": args.end_of_turn_ms,
        "streaming_recognition": args.streaming_stt,
        "turn": {
            "detector": args.turn_detector, "threshold": args.turn_threshold,
            "finished_ms": args.turn_finished_ms, "max_wait_ms": args.turn_max_wait_ms,
            "unsure_ms": args.turn_unsure_ms, "unsure_share": args.turn_unsure_share,
        },
    }  # fmt: skip
    if args.system_prompt:
        conversation["system_prompt"] = read_system_prompt(args.system_prompt)
    options["conversation"] = conversation
    if args.persona is not None:
        from lipstream.talk.knowledge.persona import Persona

        if args.system_prompt:
            raise LipstreamError("--system-prompt and --persona both give the instructions; use one")
        options["persona"] = Persona.load(args.persona)
    if args.knowledge is not None:
        options["knowledge"] = args.knowledge.expanduser().resolve()
    if args.stt_url and not args.stt_url.startswith(("http://", "https://")):
        raise LipstreamError(f"--stt-url must start with http:// or https:// (got {args.stt_url})")
    if args.stt_model and not (args.stt_model / "model.bin").is_file():
        raise LipstreamError(f"--stt-model {args.stt_model}: no model.bin; give a CTranslate2 Whisper folder")
    if args.llm_url and not args.llm_url.startswith(("http://", "https://")):
        raise LipstreamError(f"--llm-url must start with http:// or https:// (got {args.llm_url})")
    try:
        config = AgentConfig(**options)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = [str(part) for part in first["loc"] if part != "conversation"]
        name = f"turn-{loc[1]}" if loc[0] == "turn" and len(loc) > 1 else FLAG_OF.get(loc[0], loc[0])
        raise LipstreamError(f"--{name.replace('_', '-')}: {first['msg']}") from None
    return config


async def _serve(server, config) -> int:
    """Run the server, printing the page URL once the socket is bound."""
    task = asyncio.create_task(server.serve())
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    if server.started:
        from lipstream.server.launch import serving_line

        print(serving_line(config, server.servers[0].sockets[0].getsockname()[1]), flush=True)
    try:
        await task
    except SystemExit:  # uvicorn exits when it cannot bind
        raise LipstreamError(
            f"could not listen on {config.host}:{config.port} (in use? try --port 0)"
        ) from None
    if not server.started:
        raise LipstreamError(f"could not listen on {config.host}:{config.port} (in use? try --port 0)")
    return 0


def _warn_of_unblinking_avatars(avatars_dir: Path | None) -> None:
    """One warning per avatar prepared before blinks were drawn, with the command that adds them."""
    from lipstream.avatar.bundle import bundle_path, list_avatars, read_manifest

    for name in list_avatars(avatars_dir):  # the manifests alone: start-up opens no arrays or videos
        try:
            note = read_manifest(bundle_path(name, avatars_dir)).blink_note()
        except LipstreamError:
            continue  # a broken bundle is refused when a session asks for it, with its own error
        if note:
            log.warning("avatar '%s': %s", name, note)

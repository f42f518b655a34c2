"""`lipstream serve --ray`: the same FastAPI app in Ray Serve replicas, behind Serve's HTTP proxy.

Each replica loads and warms its engine in its constructor (so it takes no traffic before it is warm),
takes at most `sessions_per_replica` sessions (a WebSocket session is one ongoing request to Serve), and
the deployment autoscales on ongoing sessions. Replicas report their metrics text to one small named actor
(the board), so `GET /metrics` on any replica answers for all of them, labelled by replica; the board also
keeps failed warm-ups, shown at /healthz. Ray is imported only here, only under `--ray`.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import socket
import sys
import threading
import time
from typing import Any

from pydantic import BaseModel, Field, model_validator

from lipstream.errors import LipstreamError
from lipstream.server.config import ServerConfig
from lipstream.talk.agent import AgentConfig
from lipstream.talk.seats import default_capacity

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'lipstream[ray]'"
BOARD_SUFFIX = "-board"
NAMESPACE = "lipstream"  # where the board actor lives (replicas run in Serve's own namespace)
REPORT_INTERVAL_SECONDS = 2.0  # how often a replica sends its metrics to the board
REPORT_TTL_SECONDS = 10.0  # a replica silent this long (dead or gone) drops out of /metrics
MAX_WARMUP_FAILURES = 20
PROXY_READY_TIMEOUT_S = 45.0  # how long Serve's controller gives a starting HTTP proxy (serve.start waits 60)


class RayOptions(BaseModel):
    """How `serve --ray` spreads sessions over a Ray cluster."""

    address: str | None = None  # None: a local cluster on 127.0.0.1; "auto" or "ray://HOST:10001"
    app_name: str = "lipstream"
    min_replicas: int = Field(1, ge=0)  # 0 allowed: the first session after idle then waits for a warm-up
    max_replicas: int = Field(2, ge=1)
    sessions_per_replica: int = Field(4, ge=1)  # Serve's max_ongoing_requests
    target_sessions: float | None = Field(None, gt=0)  # per replica, for autoscaling (default K * 0.75)
    cpus_per_replica: float = Field(1.0, gt=0)
    gpus_per_replica: float = Field(0.0, ge=0)
    upscale_delay_s: float = Field(3.0, ge=0)
    downscale_delay_s: float = Field(60.0, ge=0)
    graceful_shutdown_s: float = Field(5.0, ge=0)  # sessions left on a replica being removed, then cut
    num_cpus: int | None = Field(None, ge=1)  # a local cluster's CPUs (default: the machine's)

    @model_validator(mode="after")
    def _replicas_in_order(self) -> RayOptions:
        if self.min_replicas > self.max_replicas:
            raise ValueError("--min-replicas must not exceed --max-replicas")
        return self

    @property
    def target(self) -> float:
        """Ongoing sessions per replica the autoscaler aims for."""
        return self.target_sessions or max(1.0, 0.75 * self.sessions_per_replica)


class ReplicaSpec(BaseModel):
    """Everything a replica needs to build the server (sent to it by value)."""

    config: ServerConfig
    engine_options: dict[str, Any] = Field(default_factory=dict)
    agent: AgentConfig | None = None
    board: str  # the board actor's name


def for_conversations(options: RayOptions, agent: AgentConfig) -> tuple[RayOptions, AgentConfig]:
    """`serve --ray --agent`: replicas sized by conversations (issue 49). Each replica seats
    `--max-conversations` (default: one per CPU it reserves) and keeps its own line; Serve takes at most
    seats + line sessions to a replica and routes a new one to the less busy of two (so conversations fill
    free seats across replicas before anyone waits in a line), and the autoscaler adds a replica when the
    seats are full. Options given on the command line are kept."""
    seats = agent.max_conversations or default_capacity(math.ceil(options.cpus_per_replica))
    given = options.model_fields_set
    update: dict[str, Any] = {}
    if "sessions_per_replica" not in given:
        update["sessions_per_replica"] = seats + agent.max_waiting
    if "target_sessions" not in given:
        update["target_sessions"] = float(seats)
    return options.model_copy(update=update), agent.model_copy(update={"max_conversations": seats})


def import_ray() -> tuple[Any, Any]:
    """`(ray, ray.serve)`, or a one-line error saying how to install them."""
    try:
        import ray
        from ray import serve
    except ImportError:
        raise LipstreamError(f"--ray needs Ray Serve, which is not installed: {INSTALL_HINT}") from None
    return ray, serve


def free_port(host: str) -> int:
    """A TCP port free on `host` now (Serve's proxy cannot be told to pick one)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def connect_cluster(ray: Any, options: RayOptions) -> bool:
    """Join the cluster at `options.address`, or start a local one bound to 127.0.0.1; True when local."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves this machine
    # Serve's controller kills an HTTP proxy that is not ready within 5 s (then 10, 15, ...), and
    # `serve.start` fails when its first proxy dies: on a loaded machine starting its worker alone takes
    # longer (measured: a 2-core box with two busy processes). A local cluster's processes inherit this.
    os.environ.setdefault("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", str(PROXY_READY_TIMEOUT_S))
    if options.address:
        _check_reachable(options.address)
        try:
            ray.init(
                address=options.address, namespace=NAMESPACE, logging_level=logging.WARNING,
                log_to_driver=False,
            )  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ...
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise LipstreamError(
                f"no Ray cluster at {options.address} ({first}); start one with `ray start --head` "
                "or leave out --ray-address for a local cluster"
            ) from None
        return False
    ray.init(
        _node_ip_address="127.0.0.1", namespace=NAMESPACE, include_dashboard=False, num_cpus=options.num_cpus,
        logging_level=logging.WARNING, log_to_driver=False,
    )  # fmt: skip
    return True


def _check_reachable(address: str, timeout: float = 3.0) -> None:
    """Fail in seconds when nothing listens at HOST:PORT (Ray's own client retries for minutes)."""
    if address == "auto":
        return  # Ray finds the local cluster's address itself, and says quickly when there is none
    host, _, port = address.removeprefix("ray://").rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or "timed out"
        raise LipstreamError(
            f"no Ray cluster at {address} ({reason}); start one with `ray start --head` "
            "or leave out --ray-address for a local cluster"
        ) from None


def _board_class(ray: Any) -> Any:
    @ray.remote(num_cpus=0)
    class MetricsBoard:
        """The replicas' latest metrics texts and their failed warm-ups (one per application)."""

        def __init__(self) -> None:
            self.reports: dict[str, tuple[float, str, int]] = {}  # replica -> (when, metrics text, pid)
            self.failures: list[dict[str, Any]] = []

        def report(self, replica: str, text: str, pid: int) -> None:
            self.reports[replica] = (time.monotonic(), text, pid)

        def forget(self, replica: str) -> None:
            self.reports.pop(replica, None)

        def _live(self) -> dict[str, tuple[float, str, int]]:
            now = time.monotonic()
            self.reports = {k: v for k, v in self.reports.items() if now - v[0] < REPORT_TTL_SECONDS}
            return self.reports

        def texts(self) -> dict[str, str]:
            return {k: v[1] for k, v in self._live().items()}

        def replicas(self) -> dict[str, int]:
            """{replica id: pid} of the replicas that reported lately."""
            return {k: v[2] for k, v in self._live().items()}

        def warmup_failed(self, replica: str, message: str) -> None:
            self.failures = [*self.failures, {"replica": replica, "error": message, "at": time.time()}]
            self.failures = self.failures[-MAX_WARMUP_FAILURES:]

        def warmup_failures(self) -> list[dict[str, Any]]:
            return self.failures

    return MetricsBoard


def _replica_class(serve: Any) -> Any:
    @serve.ingress()
    class LipstreamReplica:
        """One replica: lipstream's app around an engine loaded and warmed before the first request."""

        async def __init__(self, spec: dict[str, Any]) -> None:
            import ray

            self.spec = ReplicaSpec.model_validate(spec)
            self.replica_id = serve.get_replica_context().replica_id.unique_id
            self.board = ray.get_actor(self.spec.board, namespace=NAMESPACE)
            self._failures: list[dict[str, Any]] = []  # other replicas' failed warm-ups, from the board
            self._replicas: dict[str, int] = {}  # the live replicas' pids, from the board
            try:
                self.lipstream_app, self.metrics = await asyncio.to_thread(self._build)
            except Exception as exc:
                log.exception("replica %s: warm-up failed; it takes no traffic", self.replica_id)
                message = f"{type(exc).__name__}: {exc}"[:500]
                await self.board.warmup_failed.remote(self.replica_id, message)
                raise
            self._reporter = asyncio.get_running_loop().create_task(self._report_metrics())

        def _build(self) -> tuple[Any, Any]:
            from lipstream.server.app import create_app
            from lipstream.server.launch import load_serving
            from lipstream.server.warmup import warm_up
            from lipstream.talk.agent import load_agent

            config = self.spec.config.model_copy(update={"replica_id": self.replica_id})
            loaded = load_serving(config, self.spec.engine_options)  # heap, engine, voice, metrics, factory
            report = warm_up(loaded.engine, config.avatars_dir)
            agent = load_agent(self.spec.agent) if self.spec.agent is not None else None
            app = create_app(
                config, loaded.engine, loaded.factory, heap=loaded.heap, agent=agent, metrics=loaded.metrics,
                health=lambda: self._health(report.seconds), exposition=self._cluster_metrics,
            )  # fmt: skip
            return app, loaded.metrics

        def __serve_build_asgi_app__(self) -> Any:
            return self.lipstream_app

        def _health(self, warmup_seconds: float) -> dict[str, Any]:
            return {
                "replica": self.replica_id, "pid": os.getpid(), "warmup_seconds": warmup_seconds,
                "warmup_failures": self._failures,
                "replicas": self._replicas or {self.replica_id: os.getpid()},
            }  # fmt: skip

        async def _report_metrics(self) -> None:
            """Send this replica's metrics to the board, and read back the failed warm-ups."""
            while True:
                try:
                    text = self.metrics.render().decode()
                    await self.board.report.remote(self.replica_id, text, os.getpid())
                    self._failures = await self.board.warmup_failures.remote()
                    self._replicas = await self.board.replicas.remote()
                except Exception:  # noqa: BLE001 - the board restarting must not stop the replica
                    log.warning("replica %s: cannot reach the metrics board", self.replica_id)
                await asyncio.sleep(REPORT_INTERVAL_SECONDS)

        async def _cluster_metrics(self) -> bytes:
            from lipstream.server.metrics import merge_expositions

            own = self.metrics.render().decode()
            try:
                await self.board.report.remote(self.replica_id, own, os.getpid())
                texts = await self.board.texts.remote()
            except Exception:  # noqa: BLE001 - without the board, this replica still answers for itself
                log.warning("replica %s: metrics board unreachable; /metrics of this one", self.replica_id)
                texts = {self.replica_id: own}
            return merge_expositions(texts)

        def check_health(self) -> None:
            """Serve's health probe: the metrics reporter must still run."""
            if self._reporter.done():
                raise RuntimeError("the metrics reporter stopped")

        async def __del__(self) -> None:
            # Serve calls this after its drain window (graceful_shutdown_s): sessions still open are told the
            # replica is going away (1001), and players reconnect to another replica
            app = getattr(self, "lipstream_app", None)
            if app is not None:
                told = await app.state.registry.close_all()
                if told:
                    log.info("replica %s: closed %d sessions with 1001 (going away)", self.replica_id, told)
            reporter = getattr(self, "_reporter", None)
            if reporter is not None:
                reporter.cancel()
            board = getattr(self, "board", None)
            if board is not None:
                board.forget.remote(self.replica_id)

    return LipstreamReplica


def build_application(serve: Any, spec: ReplicaSpec, options: RayOptions) -> Any:
    """The Serve application: the replica deployment with its resources and autoscaling."""
    actor_options: dict[str, Any] = {"num_cpus": options.cpus_per_replica}
    if options.gpus_per_replica:
        actor_options["num_gpus"] = options.gpus_per_replica
    deployment = serve.deployment(
        _replica_class(serve),
        name="lipstream",
        max_ongoing_requests=options.sessions_per_replica,
        ray_actor_options=actor_options,
        autoscaling_config={
            "min_replicas": options.min_replicas,
            "initial_replicas": max(options.min_replicas, 1),
            "max_replicas": options.max_replicas,
            "target_ongoing_requests": options.target,
            "upscale_delay_s": options.upscale_delay_s,
            "downscale_delay_s": options.downscale_delay_s,
            "metrics_interval_s": 1.0,
            "look_back_period_s": 5.0,
        },
        graceful_shutdown_timeout_s=options.graceful_shutdown_s,
        graceful_shutdown_wait_loop_s=1.0,
        health_check_period_s=5.0,
    )
    return deployment.bind(spec.model_dump(mode="json"))


def create_board(ray: Any, name: str) -> Any:
    """The application's metrics board (created once; found again by name)."""
    return _board_class(ray).options(
        name=name, namespace=NAMESPACE, get_if_exists=True, lifetime="detached"
    ).remote()


def app_builder(args: dict[str, Any]) -> Any:
    """Entry point for a Serve config file (`import_path: lipstream.server.ray_serve:app_builder`, see
    deploy/serve-config.yaml). `args`: `server` (ServerConfig fields: avatars_dir, engine, voice, limits,
    ...), `ray` (RayOptions fields: sessions_per_replica, min/max_replicas, ...), `engine_options`, `agent`
    (AgentConfig fields; present: sessions may ask for a conversation). The token
    comes from $LIPSTREAM_TOKEN when `server.token` is not set."""
    ray, serve = import_ray()
    options = RayOptions(**(args.get("ray") or {}))
    server = dict(args.get("server") or {})
    server.setdefault("token", os.environ.get("LIPSTREAM_TOKEN") or None)
    config = ServerConfig(**server)
    board_name = options.app_name + BOARD_SUFFIX
    create_board(ray, board_name)
    agent = AgentConfig(**args["agent"]) if args.get("agent") else None  # AgentConfig fields: `serve --agent`
    if agent is not None:
        options, agent = for_conversations(options, agent)
    spec = ReplicaSpec(
        config=config, engine_options=args.get("engine_options") or {}, agent=agent, board=board_name
    )
    return build_application(serve, spec, options)


def run_ray_serve(
    config: ServerConfig, options: RayOptions, engine_options: dict[str, Any], agent: AgentConfig | None
) -> int:
    """Deploy on the cluster, print the URL when every initial replica is warm, serve until stopped."""
    ray, serve = import_ray()
    local = connect_cluster(ray, options)
    try:
        port = config.port or free_port(config.host)
        board_name = options.app_name + BOARD_SUFFIX
        board = create_board(ray, board_name)
        spec = ReplicaSpec(config=config, engine_options=engine_options, agent=agent, board=board_name)
        serve.start(http_options={"host": config.host, "port": port})
        try:
            serve.run(build_application(serve, spec, options), name=options.app_name, route_prefix="/")
        except Exception as exc:  # noqa: BLE001 - a deploy failure is the replicas' warm-up failing
            failures = ray.get(board.warmup_failures.remote())
            lines = [ln for ln in str(exc).strip().splitlines() if ln.strip()]
            reason = failures[-1]["error"] if failures else (lines[-1] if lines else type(exc).__name__)
            raise LipstreamError(
                f"the replicas failed to warm up ({reason.splitlines()[0]}); "
                "their logs are under /tmp/ray/session_latest/logs/serve"
            ) from None
        suffix = f"/?token={config.token}" if config.token else "/"
        print(f"lipstream serving at http://{config.host}:{port}{suffix} (Ray Serve)", flush=True)
        _wait_for_stop()
        return 0
    finally:
        _stop(ray, serve, options, local)


def _wait_for_stop() -> None:
    """Block until SIGTERM, SIGINT or SIGHUP. Ray's driver puts its own SIGTERM handler in place (it dies
    on the spot), so ours is set again here: the application is then taken down in order."""
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(1.0):
        pass
    print("stopping: taking the Ray Serve application down", file=sys.stderr, flush=True)


def _stop(ray: Any, serve: Any, options: RayOptions, local: bool) -> None:
    """Take the application down; a local cluster goes with it, a shared one stays up."""
    try:
        if local:
            serve.shutdown()
        else:
            serve.delete(options.app_name)
            ray.kill(ray.get_actor(options.app_name + BOARD_SUFFIX, namespace=NAMESPACE))
    except Exception:  # noqa: BLE001 - on the way out: never hide the reason we are stopping
        log.warning("Ray Serve did not shut down cleanly", exc_info=True)
    ray.shutdown()

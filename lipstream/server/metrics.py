"""Prometheus metrics of one server (GET /metrics): sessions, frames, render stage times, client reports.

Every metric lives in the `CollectorRegistry` handed in, never in prometheus-client's global one, so two
apps in one process (tests) keep separate figures. Labels are a small fixed set (no session ids)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

if TYPE_CHECKING:
    from lipstream.talk.conversation_types import TurnReport

# render stages timed by lipstream.render (StageTimer names); anything else is counted as "other"
STAGES = ("features", "planner", "engine", "codebook", "infill", "compositor", "encode")
# the states of the embedded language model's process (lipstream.talk.models.model_process.ProcessState)
MODEL_STATES = ("starting", "up", "restarting", "failed", "stopped")
# why a session was refused before `ready` (the protocol's error codes)
REFUSALS = ("busy", "unknown_avatar", "unauthorized", "version", "bad_message", "too_large", "internal")

TTFF_BUCKETS = (0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
STAGE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28)
LATE_BUCKETS = (0.01, 0.04, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
OFFSET_BUCKETS = (-0.2, -0.1, -0.06, -0.04, -0.02, 0.0, 0.02, 0.04, 0.06, 0.1, 0.2, 0.5)
TURN_BUCKETS = (0.1, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0, 10.0, 20.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    """The metrics of one server; also the render sessions' observer (lipstream.render.timing)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.sessions_live = Gauge("lipstream_sessions_live", "Sessions open now", registry=r)
        self.sessions_opened = Counter("lipstream_sessions_opened", "Sessions that reached ready", registry=r)
        self.sessions_refused = Counter(
            "lipstream_sessions_refused", "Sessions refused before ready, by error code", ["reason"],
            registry=r,
        )
        self.frames_sent = Counter(
            "lipstream_frames_sent", "Frames sent to clients (speech or idle)", ["kind"], registry=r
        )
        self.late_frames = Counter(
            "lipstream_late_frames", "Frames made after their due time on the playback clock", registry=r
        )
        self.lateness = Histogram(
            "lipstream_frame_lateness_seconds", "How late a late frame was", buckets=LATE_BUCKETS, registry=r
        )
        self.ttff = Histogram(
            "lipstream_ttff_seconds", "First input of an utterance to its first speech frame (server side)",
            buckets=TTFF_BUCKETS, registry=r,
        )  # fmt: skip
        self.stage_seconds = Histogram(
            "lipstream_render_stage_seconds",
            "Time of one piece of render work by stage (engine: one batched call; encode: one frame)",
            ["stage"], buckets=STAGE_BUCKETS, registry=r,
        )  # fmt: skip
        self.av_offset = Histogram(
            "lipstream_client_av_offset_seconds",
            "A/V offset reported by players (client_stats av_offset_ms p50 of each report; positive: picture "
            "after its audio)",
            buckets=OFFSET_BUCKETS, registry=r,
        )  # fmt: skip
        self.turn_latency = Histogram(
            "lipstream_turn_latency_seconds",
            "Conversation turns: end of the user's speech to each stage (serve --agent)",
            ["stage"], buckets=TURN_BUCKETS, registry=r,
        )  # fmt: skip
        # the neural engine's cross-session batcher (serve --engine musetalk)
        self.batch_sessions = Histogram(
            "lipstream_engine_batch_sessions", "Sessions whose frames one engine pass carried",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32), registry=r,
        )  # fmt: skip
        self.batch_frames = Histogram(
            "lipstream_engine_batch_frames", "Frames one engine pass carried (before padding to its size)",
            buckets=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64), registry=r,
        )  # fmt: skip
        self.batch_pass = Histogram(
            "lipstream_engine_pass_seconds", "Time of one batched engine pass", buckets=STAGE_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.batch_queued = Gauge(
            "lipstream_engine_queued_frames", "Frames waiting for an engine pass", registry=r
        )
        self.batch_late = Counter(
            "lipstream_engine_late_frames", "Frames whose engine pass ended after their deadline", registry=r
        )
        for reason in REFUSALS:  # present at 0 from the start: rate() needs a first sample
            self.sessions_refused.labels(reason)
        for kind in ("speech", "idle"):
            self.frames_sent.labels(kind)

    # ---- the server's hooks ----

    def bind_live_sessions(self, count: Callable[[], int]) -> None:
        """Read the live-session gauge from `count` at scrape time (the session registry)."""
        self.sessions_live.set_function(lambda: float(count()))

    def bind_language_model(self, status: Callable[[], Mapping[str, object] | None]) -> None:
        """Read the language model process's state and restarts from `status` at scrape time."""

        def state_is(state: str) -> float:
            current = status()
            return float(current is not None and current.get("state") == state)

        def restarts() -> float:
            current = status()
            return float(current.get("restarts", 0)) if current is not None else 0.0  # type: ignore[arg-type]

        state = Gauge(
            "lipstream_language_model_state", "The embedded language model process: 1 for its current state",
            ["state"], registry=self.registry,
        )  # fmt: skip
        for name in MODEL_STATES:
            state.labels(name).set_function(lambda name=name: state_is(name))
        Gauge(
            "lipstream_language_model_restarts", "Times the language model process was restarted",
            registry=self.registry,
        ).set_function(restarts)

    def bind_conversation_seats(self, counts: Callable[[], Mapping[str, float] | None]) -> None:
        """Read the conversations answered, waiting and refused (lipstream.talk.seats) at scrape time."""

        def read(key: str) -> float:
            current = counts()
            return float(current.get(key, 0)) if current is not None else 0.0

        # all gauges read at scrape time; `refused` only grows (the server has one set of seats, never reset)
        for key, text in (
            ("active", "Conversations answered now (holding a seat)"),
            ("waiting", "Conversations waiting for a seat"),
            ("capacity", "Seats: whole-frame conversations answered at once at most (--max-conversations)"),
            ("taken", "Seats the active conversations take (one on the patch stream takes half)"),
            ("refused", "Conversations refused since start (every seat and the line full)"),
        ):
            Gauge(f"lipstream_conversations_{key}", text, registry=self.registry).set_function(
                lambda key=key: read(key)
            )

    def session_opened(self) -> None:
        """A session reached `ready`."""
        self.sessions_opened.inc()

    def session_refused(self, reason: str) -> None:
        """A session was refused before `ready` with this error code."""
        self.sessions_refused.labels(reason if reason in REFUSALS else "internal").inc()

    def frame_sent(self, speaking: bool) -> None:
        """One frame (video AU and its audio) went out."""
        self.frames_sent.labels("speech" if speaking else "idle").inc()

    def client_av_offset(self, av_offset_ms: Mapping[str, float]) -> None:
        """A player's `client_stats` report: its A/V offset p50, when it has measured any."""
        if av_offset_ms.get("count", 0) > 0:
            self.av_offset.observe(float(av_offset_ms["p50"]) / 1000.0)

    # ---- ConversationObserver (lipstream.talk.conversation_types) ----

    def turn_reported(self, report: TurnReport) -> None:
        """A conversation turn's figures: each stage reached, seconds after the end of the user's speech."""
        for stage, ms in report.as_ms().items():
            if ms is not None:
                self.turn_latency.labels(stage).observe(ms / 1000.0)

    # ---- RenderObserver (lipstream.render.timing) ----

    def stage(self, name: str, seconds: float) -> None:
        """One piece of render work."""
        self.stage_seconds.labels(name if name in STAGES else "other").observe(seconds)

    def first_frame(self, seconds: float) -> None:
        """An utterance's time to first frame."""
        self.ttff.observe(seconds)

    def late_frame(self, seconds: float) -> None:
        """A frame made after its due time."""
        self.late_frames.inc()
        self.lateness.observe(seconds)

    # ---- BatchObserver (lipstream.engines.batcher) ----

    def engine_pass(self, sessions: int, frames: int, size: int, seconds: float, late_frames: int) -> None:
        """One batched engine pass."""
        self.batch_sessions.observe(sessions)
        self.batch_frames.observe(frames)
        self.batch_pass.observe(seconds)
        if late_frames:
            self.batch_late.inc(late_frames)

    def engine_queue(self, frames: int) -> None:
        """Frames waiting for a pass now."""
        self.batch_queued.set(frames)

    # ---- exposition ----

    def render(self) -> bytes:
        """The Prometheus text exposition of every metric."""
        return generate_latest(self.registry)


class _Families:
    """A collector that yields fixed metric families (merged from several replicas' texts)."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        """The families, as given."""
        return self._families


def merge_expositions(texts: Mapping[str, str], label: str = "replica") -> bytes:
    """One exposition from several servers' texts, each sample labelled with its server's name (a Ray
    replica id: as many values as replicas, so still low-cardinality)."""
    families: dict[str, Metric] = {}
    for source, text in sorted(texts.items()):
        for family in text_string_to_metric_families(text):
            merged = families.get(family.name)
            if merged is None:
                merged = families[family.name] = Metric(family.name, family.documentation, family.type)
            for sample in family.samples:
                merged.samples.append(sample._replace(labels={**sample.labels, label: source}))
    registry = CollectorRegistry()
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)


def sum_expositions(texts: Iterable[str]) -> bytes:
    """One exposition from several workers' texts of the same server, as if one process had counted it all:
    samples with the same name and labels add up (counters, histogram buckets, live-session gauges), except a
    `_created` timestamp, which keeps the earliest."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple, Sample]] = {}
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            series = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                seen = series.get(key)
                if seen is None:
                    series[key] = sample
                elif sample.name.endswith("_created"):
                    series[key] = seen._replace(value=min(seen.value, sample.value))
                else:
                    series[key] = seen._replace(value=seen.value + sample.value)
    for name, merged in families.items():
        merged.samples.extend(values[name].values())
    registry = CollectorRegistry()
    registry.register(_Families(list(families.values())))
    return generate_latest(registry)

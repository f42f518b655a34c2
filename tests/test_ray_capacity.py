"""`serve --ray --agent` sizes replicas by conversations (issue 49 item 5): seats, line, Serve's cap and the
autoscaler's target, checked on the real Serve deployment object (no cluster is started)."""

from __future__ import annotations

import pytest

from lipstream.server.config import ServerConfig
from lipstream.server.ray_serve import RayOptions, ReplicaSpec, build_application, for_conversations
from lipstream.talk.agent import AgentConfig

serve = pytest.importorskip("ray.serve")


def test_a_replica_takes_its_seats_and_line_and_scales_on_its_seats(tmp_path) -> None:
    options, agent = for_conversations(RayOptions(cpus_per_replica=2), AgentConfig(max_waiting=3))
    assert agent.max_conversations == 2  # one seat per CPU the replica reserves, not per core of its host
    assert options.sessions_per_replica == 2 + 3 and options.target == 2.0
    spec = ReplicaSpec(config=ServerConfig(avatars_dir=tmp_path), agent=agent, board="b")
    deployment = build_application(serve, spec, options)._bound_deployment
    assert deployment.max_ongoing_requests == 5
    assert deployment._deployment_config.autoscaling_config.target_ongoing_requests == 2.0


def test_seats_given_and_serve_options_given_are_kept() -> None:
    given = RayOptions(cpus_per_replica=1, sessions_per_replica=9)
    options, agent = for_conversations(given, AgentConfig(max_conversations=3, max_waiting=1))
    assert agent.max_conversations == 3 and options.sessions_per_replica == 9 and options.target == 3.0
    options, _ = for_conversations(RayOptions(target_sessions=1.5), AgentConfig(max_conversations=3))
    assert options.target == 1.5 and options.sessions_per_replica == 3 + AgentConfig().max_waiting

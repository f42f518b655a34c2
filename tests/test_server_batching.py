"""`lipstream serve --engine musetalk` with the cross-session batcher (issue 25), a real server process on
tiny MuseTalk checkpoints of the real topology (CPU): every avatar's latents and every batch size made before
it listens, clients that connect at once all get `ready` and every frame, and /healthz and /metrics show
the passes."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import server_harness as harness
from server_harness import ServerProcess

from lipstream.server.client import run_client

pytestmark = pytest.mark.slow
avatars_root = harness.avatars_root


@pytest.fixture(scope="module")
def musetalk_server(avatars_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    from lipstream.engines.musetalk.topology import write_model_folder

    models = write_model_folder(tmp_path_factory.mktemp("tiny") / "models", versions=("1.5",), tiny=True)
    server = ServerProcess(
        avatars_root, "--engine", "musetalk", "--models-dir", str(models), "--device", "cpu",
        "--dtype", "float32", "--batch-size", "4", "--batch-sizes", "4", "8", "16", start_timeout=240,
    )  # fmt: skip
    yield server
    server.stop()


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read().decode()


def test_clients_connecting_at_once_are_all_served_from_shared_passes(musetalk_server: ServerProcess) -> None:
    health = json.loads(_get(f"{musetalk_server.http}/healthz"))
    batching = health["batching"]
    assert batching["batch_sizes"] == [4, 8, 16] and batching["warmup_seconds"] > 0

    async def four() -> list:
        names = ["small", "second", "small", "second"]  # two avatars: passes mix avatars too
        return list(
            await asyncio.gather(
                *(
                    run_client(musetalk_server.ws, name, text="Hello there, how are you today?")
                    for name in names
                )
            )
        )

    reports = asyncio.run(four())
    for report in reports:
        assert report.frames_received > 25 and report.speech_frames > 10 and report.pts_continuous
        assert report.ready_ms < 5000, report.ready_ms  # the figure itself: benchmarks/scenarios/sessions.py
    print("hello -> ready ms:", [r.ready_ms for r in reports])
    batching = json.loads(_get(f"{musetalk_server.http}/healthz"))["batching"]
    assert batching["passes"] > 0 and set(batching["passes_by_size"]) <= {"4", "8", "16", 4, 8, 16}
    metrics = _get(f"{musetalk_server.http}/metrics")
    for name in ("lipstream_engine_batch_sessions_count", "lipstream_engine_batch_frames_count",
                 "lipstream_engine_pass_seconds_count", "lipstream_engine_queued_frames"):  # fmt: skip
        assert name in metrics, name
    count = next(
        line for line in metrics.splitlines() if line.startswith("lipstream_engine_batch_sessions_count")
    )
    assert float(count.split()[-1]) == batching["passes"]

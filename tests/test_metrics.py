"""GET /metrics on a real `lipstream serve` process after real WebSocket traffic, parsed with
prometheus-client's own parser; two apps in one process keep separate registries; plain `serve` never
imports Ray."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import server_harness as harness
from prometheus_client.parser import text_string_to_metric_families
from server_harness import REPO, URL_LINE, ServerProcess
from test_server_live import collect, open_session

avatars_root = harness.avatars_root  # shared fixtures

pytestmark = pytest.mark.slow

TOKEN = "metrics-token"


@pytest.fixture(scope="module")
def token_server(avatars_root: Path):
    """A real server with a token (so /metrics is checked to need it)."""
    server = ServerProcess(avatars_root, "--token", TOKEN)
    yield server
    server.stop()


def scrape(base: str, token: str | None = TOKEN) -> dict[str, dict[tuple, float]]:
    """GET /metrics and parse it: {sample name: {sorted label items: value}}."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(base + "/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as res:
        assert res.headers["Content-Type"].startswith("text/plain; version=")
        text = res.read().decode()
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    """One sample's value (0 when absent)."""
    return samples.get(name, {}).get(tuple(sorted(labels.items())), 0.0)


def test_metrics_need_the_token(token_server: ServerProcess) -> None:
    with pytest.raises(urllib.error.HTTPError) as err:
        scrape(token_server.http, token=None)
    assert err.value.code == 401


def test_metrics_after_real_sessions(token_server: ServerProcess) -> None:
    before = scrape(token_server.http)
    assert value(before, "lipstream_sessions_live") == 0

    async def traffic() -> None:
        ws, ready = await open_session(token_server.ws, "small", token=TOKEN)
        assert ready["type"] == "ready" and "replica" not in ready  # not behind Ray
        await ws.send(json.dumps({"type": "speak", "text": "Hello there, how are you?"}))
        await collect(ws, lambda m: m["type"] == "playback_finished", timeout=60)
        offsets = {"p50": 12.0, "p95": 30.0, "max": 41.0, "mean": 14.0, "count": 50}
        await ws.send(json.dumps({"type": "client_stats", "av_offset_ms": offsets, "frames_shown": 60}))
        live = scrape(token_server.http)
        assert value(live, "lipstream_sessions_live") == 1
        await ws.send(json.dumps({"type": "ping", "id": 1}))  # the stats were read once the pong is back
        await collect(ws, lambda m: m["type"] == "pong")
        await ws.close()
        refused, answer = await open_session(token_server.ws, "nobody", token=TOKEN)
        assert answer["code"] == "unknown_avatar"
        await refused.close()

    asyncio.run(traffic())
    deadline = time.monotonic() + 10
    after = scrape(token_server.http)
    while value(after, "lipstream_sessions_live") != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
        after = scrape(token_server.http)
    assert value(after, "lipstream_sessions_live") == 0
    opened = "lipstream_sessions_opened_total"
    assert value(after, opened) == value(before, opened) + 1
    assert value(after, "lipstream_sessions_refused_total", reason="unknown_avatar") == 1
    assert value(after, "lipstream_sessions_refused_total", reason="busy") == 0
    speech = value(after, "lipstream_frames_sent_total", kind="speech")
    assert speech >= 25  # over a second of speech
    assert value(after, "lipstream_frames_sent_total", kind="idle") > 0
    assert value(after, "lipstream_ttff_seconds_count") == 1
    assert 0 < value(after, "lipstream_ttff_seconds_sum") < 10
    # every encoded frame is one encode observation; the engine ran at least once for the speech
    encodes = value(after, "lipstream_render_stage_seconds_count", stage="encode")
    assert encodes >= speech
    assert value(after, "lipstream_render_stage_seconds_count", stage="engine") >= 1
    assert value(after, "lipstream_client_av_offset_seconds_count") == 1
    # (a histogram with negative buckets has no _sum: prometheus-client leaves it out)
    assert value(after, "lipstream_client_av_offset_seconds_bucket", le="0.02") == 1
    assert value(after, "lipstream_client_av_offset_seconds_bucket", le="0.0") == 0
    # low cardinality: no label names a session
    for name, series in after.items():
        for labels in series:
            assert all(key in ("reason", "kind", "stage", "le") for key, _ in labels), (name, labels)


def test_two_apps_in_one_process_keep_their_own_figures() -> None:
    from starlette.testclient import TestClient

    from lipstream.server.app import create_app
    from lipstream.server.config import ServerConfig

    first, second = create_app(ServerConfig(), engine=None), create_app(ServerConfig(), engine=None)
    first.state.metrics.session_refused("busy")
    first.state.metrics.session_refused("busy")
    with TestClient(first) as one, TestClient(second) as two:
        a = {f.name: f for f in text_string_to_metric_families(one.get("/metrics").text)}
        b = {f.name: f for f in text_string_to_metric_families(two.get("/metrics").text)}

    def busy(families) -> float:
        return next(s.value for s in families["lipstream_sessions_refused"].samples
                    if s.name.endswith("_total") and s.labels["reason"] == "busy")  # fmt: skip

    assert busy(a) == 2 and busy(b) == 0


def _serve_without_ray(*args: str, avatars_root: Path) -> subprocess.Popen:
    """`lipstream serve` in a Python where `import ray` fails (as if Ray were not installed)."""
    code = "import sys; sys.modules['ray'] = None; from lipstream.cli import main; sys.exit(main())"
    cmd = [sys.executable, "-c", code, "serve", "--port", "0", "--avatars-dir", str(avatars_root), *args]
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_plain_serve_runs_where_ray_cannot_be_imported(avatars_root: Path) -> None:
    proc = _serve_without_ray(avatars_root=avatars_root)
    try:
        line = proc.stdout.readline()  # type: ignore[union-attr]
        assert URL_LINE.search(line), line + proc.stderr.read()  # type: ignore[union-attr]
        base = URL_LINE.search(line).group(1)
        with urllib.request.urlopen(base + "/healthz", timeout=10) as res:
            assert json.loads(res.read())["status"] == "ok"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_ray_flag_without_ray_says_how_to_install(avatars_root: Path) -> None:
    proc = _serve_without_ray("--ray", avatars_root=avatars_root)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "pip install 'lipstream[ray]'" in lines[0], err

"""The LiveKit worker's dispatch path, without a LiveKit server: the agent side's `AvatarSession.dispatch`
(real token minting, real HTTP) against the worker's real /launch endpoint (real token verification),
up to the room connection, which has no server to reach here; and the `lipstream livekit-worker` process.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("livekit.agents")

from lipstream.errors import LipstreamError  # noqa: E402
from lipstream.integrations.livekit import AvatarSession  # noqa: E402
from lipstream.integrations.livekit.dispatch import (  # noqa: E402
    AvatarDispatcher,
    WorkerSettings,
    serve_dispatcher,
)
from tests.livekit_fixtures import prepared_avatar  # noqa: E402

pytestmark = pytest.mark.timeout(120)
KEY, SECRET = "devkey", "a-secret-of-at-least-thirty-two-characters"


@pytest.fixture(scope="module")
def avatar_path(request: pytest.FixtureRequest) -> Path:
    """The small prepared avatar (see livekit_fixtures.prepared_avatar)."""
    return prepared_avatar(request)


def free_port() -> int:
    """A TCP port nobody listens on (for the worker, or as a LiveKit server that is not there)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_launch_is_verified_then_joins(avatar_path: Path) -> None:
    """A launch with a token minted from the shared key pair is accepted and the worker goes to join the
    room (which fails here: no LiveKit server, and says so in /rooms); wrong secret, wrong room, an
    unknown avatar, a bad body or an unreachable worker are refused with their reason."""
    dead_server = f"ws://127.0.0.1:{free_port()}"

    async def main() -> None:
        settings = WorkerSettings(url=dead_server, api_key=KEY, api_secret=SECRET, avatar=str(avatar_path))
        port = free_port()
        runner = await serve_dispatcher(AvatarDispatcher(settings), "127.0.0.1", port)
        worker_url = f"http://127.0.0.1:{port}"
        try:
            agent = AvatarSession(worker_url=worker_url, api_key=KEY, api_secret=SECRET)
            answer = await agent.dispatch("room-a", "agent-1")
            assert answer == {"room": "room-a", "identity": "lipstream-avatar", "avatar": str(avatar_path)}
            async with httpx.AsyncClient() as client:
                # the same room again while its avatar is starting: refused
                again = agent.launch_request("room-a", "agent-1")
                conflict = await client.post(f"{worker_url}/launch", json=again)
                assert conflict.status_code == 409
                deadline = time.perf_counter() + 30
                while True:  # the generator warms up, then the connection fails: no server
                    rooms = (await client.get(f"{worker_url}/rooms")).json()
                    if "room-a" in rooms["failed"] or time.perf_counter() > deadline:
                        break
                    await asyncio.sleep(0.2)
                assert rooms["active"] == [] and "room-a" in rooms["failed"], rooms
                assert rooms["failed"]["room-a"].startswith("ConnectError"), rooms  # rtc.Room.connect ran
                # a token for another room does not let the worker into this one
                other = agent.launch_request("room-b", "agent-1")
                other["room"] = "room-c"
                wrong_room = await client.post(f"{worker_url}/launch", json=other)
                assert wrong_room.status_code == 401 and "room-c" in wrong_room.json()["error"]
                bad_body = await client.post(f"{worker_url}/launch", content=b"{not json")
                assert bad_body.status_code == 400
                assert (await client.get(f"{worker_url}/health")).text == "ok"
            with pytest.raises(LipstreamError, match=r"refused the launch \(401\).*token refused"):
                await AvatarSession(worker_url=worker_url, api_key=KEY, api_secret="x" * 40).dispatch(
                    "r", "a"
                )
            with pytest.raises(LipstreamError, match=r"\(404\).*unknown avatar 'nobody'"):
                await AvatarSession(
                    worker_url=worker_url, avatar="nobody", api_key=KEY, api_secret=SECRET
                ).dispatch("r", "a")
            with pytest.raises(LipstreamError, match=r"\(404\).*unknown avatar '../etc'"):
                await AvatarSession(
                    worker_url=worker_url, avatar="../etc", api_key=KEY, api_secret=SECRET
                ).dispatch("r", "a")
        finally:
            await runner.cleanup()
        with pytest.raises(LipstreamError, match="cannot reach the lipstream avatar worker"):
            await AvatarSession(worker_url=worker_url, api_key=KEY, api_secret=SECRET).dispatch("r", "a")

    asyncio.run(main())


def test_agent_side_needs_the_key_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without LIVEKIT_API_KEY/SECRET the agent side says which variables to set."""
    monkeypatch.delenv("LIVEKIT_API_KEY", raising=False)
    monkeypatch.delenv("LIVEKIT_API_SECRET", raising=False)
    with pytest.raises(LipstreamError, match="LIVEKIT_API_KEY and LIVEKIT_API_SECRET"):
        AvatarSession().launch_request("room", "agent")


def lipstream_cli() -> list[str]:
    """The CLI of this environment."""
    return [sys.executable, "-m", "lipstream"]


@pytest.mark.slow  # starts the worker process
def test_worker_process_serves_and_stops(avatar_path: Path) -> None:
    """`lipstream livekit-worker` starts, answers /health, and exits cleanly on SIGTERM."""
    port = free_port()
    env = {**os.environ, "LIVEKIT_API_KEY": KEY, "LIVEKIT_API_SECRET": SECRET}
    proc = subprocess.Popen(
        [*lipstream_cli(), "livekit-worker", "--url", f"ws://127.0.0.1:{free_port()}",
         "--avatar", str(avatar_path), "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert f"POST http://127.0.0.1:{port}/launch" in line, (
            line,
            proc.stderr.read() if proc.poll() else "",
        )
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).text == "ok"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 143  # 128 + SIGTERM, after a clean shutdown
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.slow
def test_worker_refuses_bad_setup_in_one_line(tmp_path: Path) -> None:
    """Missing server/credentials, an unknown avatar, or no livekit installed: exit 2 and one line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIVEKIT_")}
    env["LIPSTREAM_HOME"] = str(tmp_path)
    cases = [
        (["--avatar", "anchor"], "needs --url, --api-key, --api-secret"),
        (
            ["--avatar", "nobody", "--url", "ws://x", "--api-key", "k", "--api-secret", "s"],
            "unknown avatar 'nobody'",
        ),
    ]
    for args, message in cases:
        done = subprocess.run(
            [*lipstream_cli(), "livekit-worker", *args], capture_output=True, text=True, env=env, timeout=60
        )
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and message in lines[0], done.stderr
    # an environment without livekit: the import fails, the message names the extra
    hide_livekit = (
        "import sys\n"
        "class Hide:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'livekit' or name.startswith('livekit.'):\n"
        "            raise ImportError('no livekit here')\n"
        "sys.meta_path.insert(0, Hide())\n"
        "from lipstream.cli import main\n"
        "sys.exit(main(['livekit-worker', '--avatar', 'x', '--url', 'ws://x', '--api-key', 'k', "
        "'--api-secret', 's']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", hide_livekit], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 2 and "pip install 'lipstream[livekit]'" in done.stderr, done.stderr

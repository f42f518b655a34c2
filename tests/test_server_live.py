"""A real `lipstream serve` process over a real WebSocket: handshake, speech, interrupt, bad input."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request

import pytest
import server_harness as harness
import websockets
from server_harness import ServerProcess

from lipstream.server.protocol import Flags, Kind, MediaMessage, decode_media

avatars_root = harness.avatars_root  # shared fixtures
live_server = harness.live_server

pytestmark = pytest.mark.slow


def http_json(url: str, token: str | None = None) -> tuple[int, dict]:
    """GET a JSON endpoint; (status, body)."""
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(req, timeout=10) as res:
            return res.status, json.loads(res.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def open_session(url: str, avatar: str, **hello) -> tuple[websockets.ClientConnection, dict]:
    """Connect and say hello; return the socket and the server's first answer."""
    ws = await websockets.connect(url, max_size=None)
    await ws.send(json.dumps({"type": "hello", "version": 1, "avatar": avatar, **hello}))
    first = json.loads(await asyncio.wait_for(ws.recv(), 30))
    return ws, first


async def collect(ws, until, timeout: float = 30.0) -> tuple[list[MediaMessage], list[dict]]:
    """Receive media and control messages until `until(control)` is true."""
    media: list[MediaMessage] = []
    controls: list[dict] = []
    deadline = time.monotonic() + timeout
    while True:
        data = await asyncio.wait_for(ws.recv(), max(0.1, deadline - time.monotonic()))
        if isinstance(data, bytes):
            media.append(decode_media(data))
            continue
        msg = json.loads(data)
        controls.append(msg)
        if until(msg):
            return media, controls


def test_health_avatars_and_page(live_server: ServerProcess) -> None:
    status, health = http_json(live_server.http + "/healthz")
    assert status == 200 and health["status"] == "ok" and health["engine"] == "viseme"
    status, body = http_json(live_server.http + "/api/avatars")
    assert status == 200
    assert {a["name"] for a in body["avatars"]} == {"small", "second"}
    assert all(a["width"] == 360 and a["height"] == 640 for a in body["avatars"])
    page = urllib.request.urlopen(live_server.http + "/", timeout=10).read().decode()
    assert '<canvas id="video"' in page and "/static/app.js" in page
    player = urllib.request.urlopen(live_server.http + "/static/player.js", timeout=10).read().decode()
    assert "class LivePlayer" in player


def test_speak_streams_idr_first_continuous_frames_with_their_audio(live_server: ServerProcess) -> None:
    async def run() -> None:
        ws, ready = await open_session(live_server.ws, "small")
        assert ready["type"] == "ready" and ready["avatar"] == "small"
        assert ready["codec"].startswith("avc1.42") and (ready["width"], ready["height"]) == (360, 640)
        await ws.send(json.dumps({"type": "speak", "text": "Hello there, how are you?"}))
        media, controls = await collect(ws, lambda m: m["type"] == "playback_finished", timeout=60)
        await ws.close()
        videos = [m for m in media if m.kind == Kind.VIDEO]
        audios = [m for m in media if m.kind == Kind.AUDIO]
        assert videos[0].flags & Flags.KEYFRAME and videos[0].pts == 0
        assert [v.pts for v in videos] == [640 * i for i in range(len(videos))]
        assert [a.seq for a in audios] == [v.seq for v in videos]
        assert all(len(a.payload) == 1280 for a in audios)
        assert [m.kind for m in media[:4]] == [Kind.VIDEO, Kind.AUDIO, Kind.VIDEO, Kind.AUDIO]
        speech = [v for v in videos if v.flags & Flags.SPEAKING]
        assert len(speech) > 25  # over a second of speech
        started = next(c for c in controls if c["type"] == "speech_started")
        finished = controls[-1]
        assert started["position_samples"] == speech[0].pts
        assert finished["interrupted"] is False and finished["utterance_id"] == started["utterance_id"]
        assert finished["position_samples"] == speech[-1].pts + 640
        assert speech[-1].flags & Flags.END_OF_SPEECH
        loud = [a for a in audios if a.flags & Flags.SPEAKING and max(a.payload) > 10]
        assert loud, "speech frames carry the spoken audio"

    asyncio.run(run())


def test_interrupt_cuts_speech_and_the_stream_resumes_with_an_idr(live_server: ServerProcess) -> None:
    async def run() -> None:
        ws, _ = await open_session(live_server.ws, "small")
        long_text = "This is a long sentence that keeps going for quite a while. " * 4
        await ws.send(json.dumps({"type": "speak", "text": long_text}))
        await collect(ws, lambda m: m["type"] == "speech_started", timeout=60)
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        await ws.send(json.dumps({"type": "interrupt"}))
        _, controls = await collect(ws, lambda m: m["type"] == "playback_finished", timeout=10)
        ack_ms = (time.monotonic() - t0) * 1000
        finished = controls[-1]
        assert finished["interrupted"] is True
        assert ack_ms < 1000
        after: list[MediaMessage] = []
        while len(after) < 30:
            data = await asyncio.wait_for(ws.recv(), 10)
            if isinstance(data, bytes):
                after.append(decode_media(data))
        await ws.close()
        videos = [m for m in after if m.kind == Kind.VIDEO]
        audios = [m for m in after if m.kind == Kind.AUDIO]
        assert audios[0].pts == finished["position_samples"], "the stream restarts at the cut"
        assert videos[0].flags & Flags.KEYFRAME, "pictures resume with an IDR"
        assert videos[0].pts - audios[0].pts <= 10 * 640
        assert not any(m.flags & Flags.SPEAKING for m in after), "no speech after the cut"

    asyncio.run(run())


def test_two_sessions_with_different_avatars_at_once(live_server: ServerProcess) -> None:
    async def one(avatar: str) -> tuple[dict, int]:
        ws, ready = await open_session(live_server.ws, avatar)
        await ws.send(json.dumps({"type": "speak", "text": "Two at once."}))
        media, _ = await collect(ws, lambda m: m["type"] == "playback_finished", timeout=90)
        _, admin = http_json(live_server.http + "/api/sessions")
        await ws.close()
        speech = sum(1 for m in media if m.kind == Kind.VIDEO and m.flags & Flags.SPEAKING)
        return ready, speech, admin

    async def run() -> None:
        (ra, sa, admin), (rb, sb, _) = await asyncio.gather(one("small"), one("second"))
        assert {ra["avatar"], rb["avatar"]} == {"small", "second"}
        assert ra["session_id"] != rb["session_id"]
        assert sa > 10 and sb > 10
        assert len(admin["sessions"]) >= 1 and {"server", "client"} <= set(admin["sessions"][0])

    asyncio.run(run())


def test_unknown_avatar_gets_a_clear_error_before_any_stream(live_server: ServerProcess) -> None:
    async def run() -> None:
        ws, first = await open_session(live_server.ws, "nobody")
        assert first["type"] == "error" and first["code"] == "unknown_avatar" and first["fatal"]
        assert "nobody" in first["message"] and "small" in first["message"]
        with pytest.raises(websockets.exceptions.ConnectionClosed) as info:
            await asyncio.wait_for(ws.recv(), 5)
        assert info.value.rcvd.code == 4404
        ws, first = await open_session(live_server.ws, "../small")  # names only, never paths
        assert first["code"] == "unknown_avatar"
        await ws.close()

    asyncio.run(run())


def test_malformed_messages_get_errors_and_the_session_goes_on(live_server: ServerProcess) -> None:
    async def run() -> None:
        ws, ready = await open_session(live_server.ws, "small")
        assert ready["type"] == "ready"
        bad = [
            "{nope",
            json.dumps({"type": "dance"}),
            json.dumps({"type": "speak"}),
            json.dumps({"type": "speak", "text": "   "}),
            json.dumps({"type": "hello", "version": 1, "avatar": "small"}),
            b"\x01\x02",
            MediaMessage(Kind.VIDEO, b"x").encode(),
            MediaMessage(Kind.PCM, b"\x00\x00", aux=100).encode(),
            MediaMessage(Kind.PCM, b"\x00\x00\x00", aux=16000).encode(),
            MediaMessage(Kind.UPLOAD, b"this is not audio at all" * 10).encode(),
        ]
        for message in bad:
            await ws.send(message)
        errors = []
        while len(errors) < len(bad):
            data = await asyncio.wait_for(ws.recv(), 20)
            if isinstance(data, str):
                msg = json.loads(data)
                assert msg["type"] == "error" and msg["fatal"] is False, msg
                errors.append(msg)
        codes = [e["code"] for e in errors]
        assert codes.count("bad_message") >= 7 and "bad_text" in codes and "bad_audio" in codes
        await ws.send(json.dumps({"type": "ping", "id": 7}))
        _, controls = await collect(ws, lambda m: m["type"] == "pong", timeout=10)
        assert controls[-1]["id"] == 7
        await ws.send(json.dumps({"type": "speak", "text": "Still here."}))
        media, _ = await collect(ws, lambda m: m["type"] == "playback_finished", timeout=60)
        assert any(m.flags & Flags.SPEAKING for m in media)
        await ws.close()

    asyncio.run(run())


def test_token_limits_and_oversized_messages(avatars_root) -> None:
    server = ServerProcess(
        avatars_root, "--token", "s3cret", "--max-message-mb", "0.05", "--max-sessions", "1"
    )
    try:
        assert http_json(server.http + "/healthz")[0] == 200
        assert http_json(server.http + "/api/avatars")[0] == 401
        assert http_json(server.http + "/api/avatars", token="wrong")[0] == 401
        assert http_json(server.http + "/api/avatars", token="s3cret")[0] == 200

        async def run() -> None:
            ws, first = await open_session(server.ws, "small", token="wrong")
            assert first["code"] == "unauthorized"
            with pytest.raises(websockets.exceptions.ConnectionClosed) as info:
                await asyncio.wait_for(ws.recv(), 5)
            assert info.value.rcvd.code == 4401
            ws, ready = await open_session(server.ws + "?token=s3cret", "small")
            assert ready["type"] == "ready" and ready["limits"]["max_sessions"] == 1
            other, busy = await open_session(server.ws, "small", token="s3cret")
            assert busy["code"] == "busy"
            await other.close()
            big = MediaMessage(Kind.PCM, bytes(60 * 1024), aux=16000).encode()
            await ws.send(big)
            await ws.send(json.dumps({"type": "speak", "text": "x" * 60_000}))
            errors = []
            while len(errors) < 2:
                data = await asyncio.wait_for(ws.recv(), 10)
                if isinstance(data, str):
                    errors.append(json.loads(data))
            assert [e["code"] for e in errors] == ["too_large", "too_large"]
            await ws.send(json.dumps({"type": "ping", "id": 1}))
            await collect(ws, lambda m: m["type"] == "pong", timeout=10)
            huge = MediaMessage(Kind.UPLOAD, bytes(200 * 1024)).encode()  # over twice the limit
            await ws.send(huge)
            with pytest.raises(websockets.exceptions.ConnectionClosed) as info:
                while True:
                    await asyncio.wait_for(ws.recv(), 10)
            assert info.value.rcvd.code == 1009

        asyncio.run(run())
    finally:
        server.stop()


def test_disconnects_mid_utterance_free_everything(live_server: ServerProcess) -> None:
    async def cycle(i: int) -> None:
        ws, ready = await open_session(live_server.ws, "small" if i % 2 else "second")
        assert ready["type"] == "ready"
        if i % 3 == 0:
            pcm = MediaMessage(Kind.PCM, bytes(range(256)) * 50, aux=16000).encode()
            await ws.send(pcm)  # an utterance that is never flushed
        for _ in range(4):
            await ws.recv()
        await ws.close()

    async def run(start: int, count: int) -> None:
        for i in range(start, start + count):
            await cycle(i)

    asyncio.run(run(0, 20))
    time.sleep(1.0)
    before = live_server.rss_kib("RssAnon")  # the heap: a worker maps frame pages as its sessions reach them
    asyncio.run(run(20, 100))
    time.sleep(1.0)
    after = live_server.rss_kib("RssAnon")
    assert http_json(live_server.http + "/healthz")[1]["sessions"] == 0
    assert after - before < 40_000, f"server heap grew {before} -> {after} KiB over 100 cycles"

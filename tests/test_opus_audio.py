"""Opus audio on the live stream (protocol 1.3): a real `lipstream serve` process over a real WebSocket, the
real libopus encoder in the server and decoder here; PCM clients unchanged."""

from __future__ import annotations

import asyncio
import json
import wave
from pathlib import Path

import av
import numpy as np
import pytest
import server_harness as harness
import websockets
from server_harness import ServerProcess
from test_server_live import collect, open_session

from lipstream.media.opus import PRE_SKIP, FrameAudioDecoder, FrameAudioEncoder
from lipstream.server.client import run_client
from lipstream.server.protocol import (
    Flags,
    Kind,
    MediaMessage,
    ProtocolError,
    decode_media,
    pack_packets,
    unpack_packets,
)

avatars_root = harness.avatars_root  # shared fixtures
live_server = harness.live_server

pytestmark = pytest.mark.slow

FRAME = 640
# Measured on Piper speech at 24 kbit/s ('audio' application): r 0.98-0.99, SNR 14 dB against the PCM the
# server sends. The bounds sit well under that and far over what a misaligned stream gives (one pre-skip of
# 104 samples off: r < 0.5 on speech), so they check both the codec and that decoded samples stay on the pts
# grid.
MIN_CORRELATION = 0.95
MIN_SNR_DB = 10.0


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """About 3 s of Piper speech as a 16 kHz WAV, and its samples."""
    from lipstream.talk.voices.tts import create_tts

    speech = create_tts("piper").synthesize(
        "Good evening. Tonight the weather along the coast is calm and mild."
    )
    pcm = np.clip(np.round(speech.pcm * 32767), -32768, 32767).astype(np.int16)
    path = tmp_path_factory.mktemp("opus") / "speech.wav"
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(16000)
        out.writeframes(pcm.tobytes())
    return path, pcm


async def _spoken_upload(url: str, wav: Path, **hello) -> tuple[dict, list[MediaMessage], list[dict]]:
    ws, ready = await open_session(url, "small", **hello)
    await ws.send(MediaMessage(Kind.UPLOAD, wav.read_bytes()).encode())
    media, controls = await collect(ws, lambda m: m["type"] == "playback_finished", timeout=60)
    tail = 0
    while tail < 3:  # a few idle frames more: the decoded stream lags by the pre-skip until the next packet
        data = await asyncio.wait_for(ws.recv(), 10)
        if isinstance(data, bytes):
            media.append(decode_media(data))
            tail += media[-1].kind == Kind.AUDIO
    await ws.close()
    return ready, media, controls


def _speech_audio(
    media: list[MediaMessage], controls: list[dict], opus: bool
) -> tuple[np.ndarray, list[int]]:
    """The utterance's audio (decoded when Opus, the whole stream through one decoder) and the pts of its
    audio messages relative to speech_started."""
    start = next(c for c in controls if c["type"] == "speech_started")["position_samples"]
    end = next(c for c in controls if c["type"] == "playback_finished")["position_samples"]
    decoder = FrameAudioDecoder()
    pieces, pts = [], []
    for msg in (m for m in media if m.kind == Kind.AUDIO):
        if opus:
            pcm = decoder.decode(unpack_packets(msg.payload), restart=bool(msg.flags & Flags.KEYFRAME))
        else:
            pcm = np.frombuffer(msg.payload, "<i2")
        pieces.append((msg.pts, pcm))
        if start <= msg.pts < end:
            pts.append(msg.pts - start)
    stream = np.concatenate([p for _, p in pieces])
    # the decoder's output is aligned with the stream's first message (pts of pieces[0]), sample for sample
    first = pieces[0][0]
    return stream[start - first : end - first].astype(np.float64), pts


def _correlation(a: np.ndarray, b: np.ndarray, lag: int = 0) -> float:
    n = min(len(a), len(b)) - 2 * abs(lag) - 1
    return float(np.corrcoef(a[abs(lag) + lag : abs(lag) + lag + n], b[abs(lag) : abs(lag) + n])[0, 1])


def test_opus_session_audio_matches_the_pcm_session(live_server: ServerProcess, speech_wav) -> None:
    wav, _ = speech_wav

    async def run():
        return await asyncio.gather(
            _spoken_upload(live_server.ws, wav), _spoken_upload(live_server.ws, wav, audio_codec="opus")
        )

    (pcm_ready, pcm_media, pcm_controls), (opus_ready, opus_media, opus_controls) = asyncio.run(run())
    assert pcm_ready["minor"] >= 3 and pcm_ready["audio_codec"] == "pcm" and "audio" not in pcm_ready
    assert opus_ready["audio_codec"] == "opus"
    assert opus_ready["audio"] == {
        "codec": "opus", "sample_rate": 48000, "channels": 1, "frame_ms": 20, "packets_per_message": 2,
        "pre_skip": PRE_SKIP, "bitrate": 24000,
    }  # fmt: skip
    assert opus_ready["sample_rate"] == 16000  # pts stay in 16 kHz samples
    reference, pcm_pts = _speech_audio(pcm_media, pcm_controls, opus=False)
    decoded, opus_pts = _speech_audio(opus_media, opus_controls, opus=True)
    # the same frames on the same pts grid: one audio message per frame, in step with its video
    assert opus_pts == pcm_pts and len(opus_pts) > 50
    videos = [m for m in opus_media if m.kind == Kind.VIDEO]
    audios = [m for m in opus_media if m.kind == Kind.AUDIO]
    assert [(a.seq, a.pts) for a in audios] == [(v.seq, v.pts) for v in videos]
    assert all(len(unpack_packets(a.payload)) == 2 for a in audios)  # two 20 ms packets per 40 ms frame
    assert [bool(a.flags & Flags.KEYFRAME) for a in audios].count(True) == 1  # one encoder start
    assert len(decoded) == len(reference)  # the utterance decodes to its exact length
    assert np.abs(reference).max() > 3000, "the utterance carries speech"
    snr = 10 * np.log10(np.sum(reference**2) / np.sum((reference - decoded) ** 2))
    r = _correlation(decoded, reference)
    assert r >= MIN_CORRELATION and snr >= MIN_SNR_DB, (r, snr)
    # what a stream off by the pre-skip would give: the bound above tells aligned from misaligned
    assert _correlation(decoded, reference, PRE_SKIP // 3) < 0.5
    # bitrate: the PCM payload is 256 kbit/s; Opus at 24 kbit/s plus its 2-byte lengths
    seconds = len([m for m in opus_media if m.kind == Kind.AUDIO]) / 25
    opus_kbit = sum(len(m.payload) for m in opus_media if m.kind == Kind.AUDIO) * 8 / 1000 / seconds
    pcm_seconds = len([m for m in pcm_media if m.kind == Kind.AUDIO]) / 25
    pcm_kbit = sum(len(m.payload) for m in pcm_media if m.kind == Kind.AUDIO) * 8 / 1000 / pcm_seconds
    assert pcm_kbit == 256.0 and opus_kbit < 40, (pcm_kbit, opus_kbit)


def test_old_client_hello_still_gets_pcm(live_server: ServerProcess) -> None:
    async def run():
        ws, ready = await open_session(live_server.ws, "small")  # a 1.2 hello: no audio_codec
        await ws.send(json.dumps({"type": "speak", "text": "Hello there."}))
        media, _ = await collect(ws, lambda m: m["type"] == "playback_finished", timeout=60)
        await ws.close()
        return ready, media

    ready, media = asyncio.run(run())
    audios = [m for m in media if m.kind == Kind.AUDIO]
    assert ready["audio_codec"] == "pcm" and "audio" not in ready
    assert audios and all(len(a.payload) == 2 * FRAME for a in audios)
    assert not any(a.flags & Flags.KEYFRAME for a in audios)  # PCM audio never carries the restart flag
    assert any(np.abs(np.frombuffer(a.payload, "<i2")).max() > 1000 for a in audios)


@pytest.mark.parametrize(
    ("value", "code", "says"),
    [
        ("mp3", "audio_codec", "no 'mp3' audio codec; it offers pcm, opus"),
        ("OPUS", "audio_codec", "no 'OPUS' audio codec"),
        (5, "bad_message", "audio_codec"),
        ("", "bad_message", "audio_codec"),
        (None, "bad_message", "audio_codec"),
    ],
)
def test_bad_audio_codec_is_refused_with_a_clear_error(live_server: ServerProcess, value, code, says) -> None:
    async def run():
        ws, first = await open_session(live_server.ws, "small", audio_codec=value)
        with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
        return first, closed.value.rcvd.code

    first, close_code = asyncio.run(run())
    assert first["type"] == "error" and first["code"] == code and first["fatal"] is True, first
    assert says in first["message"]
    assert close_code == 4400


def test_interrupt_restarts_the_encoder_and_sends_no_stale_audio(live_server: ServerProcess) -> None:
    async def run():
        ws, _ = await open_session(live_server.ws, "small", audio_codec="opus")
        await ws.send(
            json.dumps({"type": "speak", "text": "This sentence keeps going for quite a while. " * 4})
        )
        before, _ = await collect(ws, lambda m: m["type"] == "speech_started", timeout=60)
        more = []
        while len([m for m in more if m.kind == Kind.AUDIO and m.flags & Flags.SPEAKING]) < 25:
            data = await asyncio.wait_for(ws.recv(), 30)
            if isinstance(data, bytes):
                more.append(decode_media(data))
        await ws.send(json.dumps({"type": "interrupt"}))
        upto, controls = await collect(ws, lambda m: m["type"] == "playback_finished", timeout=10)
        after: list[MediaMessage] = []
        while len([m for m in after if m.kind == Kind.AUDIO]) < 25:
            data = await asyncio.wait_for(ws.recv(), 10)
            if isinstance(data, bytes):
                after.append(decode_media(data))
        await ws.close()
        return before + more + upto, controls[-1], after

    before, finished, after = asyncio.run(run())
    assert finished["interrupted"] is True
    cut = finished["position_samples"]
    audio_after = [m for m in after if m.kind == Kind.AUDIO]
    assert (
        audio_after[0].pts == cut and audio_after[0].flags & Flags.KEYFRAME
    )  # the encoder restarted at the cut
    assert not any(m.flags & Flags.KEYFRAME for m in audio_after[1:])
    assert [m.pts for m in audio_after] == [cut + FRAME * i for i in range(len(audio_after))]
    # the receiver's view: one decoder over the whole stream as it came
    decoder = FrameAudioDecoder()
    for msg in (m for m in before if m.kind == Kind.AUDIO):
        decoder.decode(unpack_packets(msg.payload), restart=bool(msg.flags & Flags.KEYFRAME))
    spoken = [m for m in before if m.kind == Kind.AUDIO and m.flags & Flags.SPEAKING]
    loud = max(np.abs(FrameAudioDecoder().decode(unpack_packets(m.payload), True)).max() for m in spoken[5:])
    first_after = decoder.decode(unpack_packets(audio_after[0].payload), restart=True)
    rest_after = np.concatenate(
        [decoder.decode(unpack_packets(m.payload), restart=False) for m in audio_after[1:]]
    )
    assert loud > 3000
    # after the cut the avatar is silent (idle frames): nothing of the speech before it leaks into the new
    # stream (an encoder carried across the cut would put its 6.5 ms of look-ahead speech here)
    assert len(first_after) == FRAME and np.abs(first_after).max() < 100, np.abs(first_after).max()
    assert np.abs(rest_after).max() < 100


def test_opus_decoder_alone_keeps_the_pts_grid_across_a_restart() -> None:
    """The encoder/decoder pair without a server: a cut mid-stream costs the previous run's last 104 samples
    (silence), and the new run starts exactly at its pts."""
    rng = np.random.default_rng(1)
    t = np.arange(FRAME * 30) / 16000
    tone = (8000 * np.sin(2 * np.pi * 440 * t) + rng.normal(0, 50, len(t))).astype(np.int16)
    encoder, decoder = FrameAudioEncoder(), FrameAudioDecoder()
    out = []
    for k in range(10):  # frames 0-9, then the stream jumps back to frame 5 (an interrupt's cut)
        packets, restarted = encoder.encode(k * FRAME, tone[k * FRAME : (k + 1) * FRAME])
        assert restarted == (k == 0)
        out.append(decoder.decode(packets, restarted))
    for k in range(5, 30):
        packets, restarted = encoder.encode(k * FRAME, tone[k * FRAME : (k + 1) * FRAME])
        assert restarted == (k == 5)
        out.append(decoder.decode(packets, restarted))
    assert [len(o) for o in out] == [FRAME - PRE_SKIP // 3] + [FRAME] * 34
    second = np.concatenate(out[10:]).astype(np.float64)  # pts 5*640 on, with the 104 owed samples first
    assert np.all(second[: PRE_SKIP // 3] == 0)
    new_run = second[PRE_SKIP // 3 :]
    ref = tone[5 * FRAME : 5 * FRAME + len(new_run)].astype(np.float64)
    assert _correlation(new_run[200:], ref[200:]) > MIN_CORRELATION
    with pytest.raises(ProtocolError, match="does not fit"):
        unpack_packets(b"\x05\x00abc")


def test_client_asks_for_opus_and_still_records_aac(live_server: ServerProcess, speech_wav, tmp_path) -> None:
    wav, _ = speech_wav
    out = tmp_path / "opus.mp4"
    report = asyncio.run(run_client(live_server.ws, "small", audio=wav, out=out, audio_codec="opus"))
    assert report.audio_codec == "opus" and report.audio_matches_video and report.pts_continuous
    assert report.audio_bytes * 8 / report.duration_seconds / 1000 < 40  # kbit/s of audio received
    with av.open(str(out)) as container:
        assert container.streams.audio[0].codec_context.name == "aac"
        samples = sum(f.samples for f in container.decode(audio=0))
    assert abs(samples / 16000 - report.duration_seconds) < 0.1


def _opus_packets_48k(pcm16: np.ndarray) -> list[bytes]:
    """`pcm16` (16 kHz) as a browser's AudioEncoder sends it: resampled to 48 kHz, libopus, 20 ms packets."""
    from lipstream.audio.decode import resample, to_int16

    pcm48 = to_int16(resample(pcm16, 16000, 48000))
    ctx = av.CodecContext.create("libopus", "w")
    ctx.sample_rate, ctx.layout, ctx.format, ctx.bit_rate = 48000, "mono", "s16", 24000
    ctx.options = {"application": "audio", "frame_duration": "20"}
    ctx.open()
    frame = av.AudioFrame.from_ndarray(pcm48.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate, frame.pts = 48000, 0
    return [bytes(p) for p in [*ctx.encode(frame), *ctx.encode(None)]]


def test_client_audio_sent_as_opus_plays_as_the_same_audio_sent_as_pcm(live_server, speech_wav) -> None:
    """Protocol 1.4: a client's audio as Opus (mic_opus messages, 48 kHz input as browsers send it) is
    decoded, its pre-skip dropped, and lip-synced exactly like the same audio sent as 48 kHz PCM chunks; a
    wrong rate or a packet libopus cannot decode is a non-fatal bad_audio error."""
    from lipstream.audio.decode import resample, to_int16

    _, pcm16 = speech_wav
    packets = _opus_packets_48k(pcm16)
    pcm48 = to_int16(resample(pcm16, 16000, 48000))
    chunk = 960  # 20 ms at 48 kHz, what the page sends

    async def spoken(messages: list[bytes]) -> tuple[dict, list[MediaMessage], list[dict]]:
        ws, ready = await open_session(live_server.ws, "small")
        for data in messages:
            await ws.send(data)
        await ws.send(json.dumps({"type": "flush"}))
        media, controls = await collect(ws, lambda m: m["type"] == "playback_finished", timeout=60)
        await ws.close()
        return ready, media, controls

    async def refused() -> list[dict]:
        ws, _ = await open_session(live_server.ws, "small")
        await ws.send(MediaMessage(Kind.MIC_OPUS, pack_packets(packets[:2]), aux=96000).encode())
        await ws.send(MediaMessage(Kind.MIC_OPUS, pack_packets([b"\xff\xff\xff"]), aux=48000).encode())
        await ws.send(json.dumps({"type": "ping", "id": 1}))
        _, controls = await collect(ws, lambda m: m["type"] == "pong", timeout=20)
        await ws.close()
        return controls

    as_pcm = [MediaMessage(Kind.PCM, pcm48[i : i + chunk].tobytes(), aux=48000).encode()
              for i in range(0, len(pcm48), chunk)]  # fmt: skip
    as_opus = [MediaMessage(Kind.MIC_OPUS, pack_packets([p]), aux=48000, flags=Flags.KEYFRAME if i == 0
                            else Flags.NONE).encode() for i, p in enumerate(packets)]  # fmt: skip
    async def both():
        return await asyncio.wait_for(asyncio.gather(spoken(as_pcm), spoken(as_opus)), 120)

    (pcm_ready, pcm_media, pcm_controls), (_, opus_media, opus_controls) = asyncio.run(both())
    assert pcm_ready["minor"] >= 4 and pcm_ready["mic_codecs"] == ["pcm", "opus"]
    reference, _ = _speech_audio(pcm_media, pcm_controls, opus=False)
    got, _ = _speech_audio(opus_media, opus_controls, opus=False)
    # the same utterance: its length within the encoder's last padded packet, its samples where they were sent
    assert abs(len(got) - len(reference)) <= 2 * FRAME, (len(got), len(reference))
    assert np.abs(reference).max() > 3000, "the utterance carries speech"
    lags = {lag: _correlation(got, reference, lag) for lag in range(-4, 5)}
    best = max(lags, key=lags.get)
    assert lags[best] >= MIN_CORRELATION and abs(best) <= 1, lags
    print(f"opus in vs pcm in: r {lags[best]:.3f} at lag {best}, lengths {len(got)} / {len(reference)}")
    opus_bytes = sum(len(p) for p in packets)
    assert opus_bytes * 8 / (len(pcm16) / 16000) < 40_000  # ~24 kbit/s up, against 768 for 48 kHz PCM

    errors = [c for c in asyncio.run(refused()) if c["type"] == "error"]
    assert [e["code"] for e in errors] == ["bad_audio", "bad_audio"] and not any(e["fatal"] for e in errors)
    assert "capture rate 96000 Hz" in errors[0]["message"] and "could not be decoded" in errors[1]["message"]

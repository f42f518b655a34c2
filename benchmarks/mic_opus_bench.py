"""The microphone as Opus vs PCM (issue 24, protocol 1.4): what goes up, and what the server then hears.

Questions spoken by the bundled Piper voice, each padded with silence and resampled to 48 kHz (what a browser
captures), are sent up both ways as the page sends them: PCM in 20 ms `pcm` messages, and Opus (libopus, the
codec in Chromium's AudioEncoder, 24 kbit/s, 20 ms packets) in one-packet `mic_opus` messages, decoded by the
server's own StreamAudioDecoder and resampled to 16 kHz by the same resampler. Per question and in total:
kbit/s up (headers included), the decoded audio against the PCM path (r, SNR), the VAD's speech start on both
(ms apart), Whisper's transcript of both (word error rate against the text, and against each other), and the
encode/decode CPU ms per 20 ms packet.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/mic_opus_bench.py

Writes benchmarks/results/mic_opus_bench.json. The browser's own figure (the Talk test's fake microphone, real
AudioEncoder): `pytest tests/test_browser_talk.py -k talk_mode -s` prints "mic kbit/s".
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import av
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_common import cpu_model  # noqa: E402

from lipstream.audio.decode import resample, to_int16  # noqa: E402
from lipstream.media.opus import StreamAudioDecoder  # noqa: E402
from lipstream.server.protocol import HEADER_SIZE, OPUS_LENGTH  # noqa: E402
from lipstream.talk.stt import WhisperSTT, word_error_rate  # noqa: E402
from lipstream.talk.tts import create_tts  # noqa: E402
from lipstream.talk.vad import VoiceActivityDetector  # noqa: E402

QUESTIONS = (
    "Could you please tell me the name of the capital city of France?",
    "What time does the museum open on Sunday mornings?",
    "How many kilometres is it from Lisbon to Madrid by train?",
    "Please stop, I have another question about the weather tomorrow.",
)
CAPTURE = 48000
PACKET = CAPTURE // 50  # 20 ms


def opus_packets(pcm48: np.ndarray, bitrate: int) -> tuple[list[bytes], float]:
    """libopus at `bitrate`, 20 ms packets of the 48 kHz capture; and encode CPU ms per packet."""
    ctx = av.CodecContext.create("libopus", "w")
    ctx.sample_rate, ctx.layout, ctx.format, ctx.bit_rate = CAPTURE, "mono", "s16", bitrate
    ctx.options = {"application": "audio", "frame_duration": "20"}
    ctx.open()
    t0 = time.process_time()
    packets = []
    for start in range(0, len(pcm48), PACKET):  # chunk by chunk, as the page pushes them
        frame = av.AudioFrame.from_ndarray(
            pcm48[start : start + PACKET].reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate, frame.pts = CAPTURE, start
        packets += [bytes(p) for p in ctx.encode(frame)]
    packets += [bytes(p) for p in ctx.encode(None)]
    return packets, (time.process_time() - t0) * 1000 / max(len(packets), 1)


def vad_start_ms(pcm16: np.ndarray) -> float | None:
    """Where the VAD puts the speech start, in ms (None: no speech found)."""
    vad = VoiceActivityDetector()
    for start in range(0, len(pcm16), 320):
        for event in vad.push(pcm16[start : start + 320]):
            if event.kind == "speech_start":
                return event.sample / 16.0
    return None


def one_question(text: str, stt: WhisperSTT, bitrate: int) -> dict:
    """Both paths for one question: bandwidth, fidelity, VAD and transcript."""
    speech = create_tts("piper").synthesize(text).pcm
    quiet = np.zeros(8000, np.float32)  # 0.5 s of silence either side, as a microphone has
    pcm16_in = np.concatenate([quiet, speech, quiet])
    pcm48 = to_int16(resample(pcm16_in, 16000, CAPTURE))
    seconds = len(pcm48) / CAPTURE
    # the PCM path: what the server hears is the 48 kHz capture resampled to 16 kHz
    heard_pcm = resample(pcm48, CAPTURE, 16000)
    pcm_bytes = len(pcm48) * 2 + HEADER_SIZE * -(-len(pcm48) // PACKET)
    packets, encode_ms = opus_packets(pcm48, bitrate)
    decoder = StreamAudioDecoder()
    t0 = time.process_time()
    decoded = np.concatenate([decoder.decode([p], restart=i == 0) for i, p in enumerate(packets)])
    decode_ms = (time.process_time() - t0) * 1000 / len(packets)
    heard_opus = resample(decoded, CAPTURE, 16000)[: len(heard_pcm)]
    opus_bytes = sum(HEADER_SIZE + OPUS_LENGTH.size + len(p) for p in packets)
    n = min(len(heard_pcm), len(heard_opus))
    ref, got = heard_pcm[:n].astype(np.float64), heard_opus[:n].astype(np.float64)
    said_pcm, said_opus = stt.transcribe(heard_pcm).text, stt.transcribe(heard_opus).text
    start_pcm, start_opus = vad_start_ms(heard_pcm), vad_start_ms(heard_opus)
    return {
        "text": text,
        "seconds": round(seconds, 2),
        "pcm_kbit_s": round(pcm_bytes * 8 / seconds / 1000, 1),
        "opus_kbit_s": round(opus_bytes * 8 / seconds / 1000, 1),
        "r": round(float(np.corrcoef(ref, got)[0, 1]), 4),
        "snr_db": round(float(10 * np.log10(np.sum(ref**2) / np.sum((ref - got) ** 2))), 1),
        "length_samples": [len(heard_pcm), len(heard_opus)],
        "vad_start_ms": [start_pcm, start_opus],
        "transcript": [said_pcm, said_opus],
        "wer": [round(word_error_rate(text, said_pcm), 3), round(word_error_rate(text, said_opus), 3)],
        "wer_opus_vs_pcm": round(word_error_rate(said_pcm, said_opus), 3),
        "encode_ms_per_packet": round(encode_ms, 3),
        "decode_ms_per_packet": round(decode_ms, 3),
    }


def main() -> None:
    """Every question both ways; print and write the figures side by side."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bitrate", type=int, default=24000, help="the page's AudioEncoder bitrate")
    ap.add_argument("--out", type=Path, default=REPO / "benchmarks/results/mic_opus_bench.json")
    args = ap.parse_args()
    stt = WhisperSTT()
    rows = []
    for text in QUESTIONS:
        rows.append(one_question(text, stt, args.bitrate))
        print(json.dumps(rows[-1]), flush=True)
    seconds = sum(r["seconds"] for r in rows)
    report = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "cpu": cpu_model(),
        "bitrate": args.bitrate,
        "questions": rows,
        "pcm_kbit_s": round(sum(r["pcm_kbit_s"] * r["seconds"] for r in rows) / seconds, 1),
        "opus_kbit_s": round(sum(r["opus_kbit_s"] * r["seconds"] for r in rows) / seconds, 1),
        "r_min": min(r["r"] for r in rows),
        "snr_db_min": min(r["snr_db"] for r in rows),
        "vad_start_diff_ms_max": max(abs(r["vad_start_ms"][0] - r["vad_start_ms"][1]) for r in rows),
        "wer_mean": [round(float(np.mean([r["wer"][k] for r in rows])), 3) for k in (0, 1)],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    for key in ("pcm_kbit_s", "opus_kbit_s", "r_min", "snr_db_min", "vad_start_diff_ms_max", "wer_mean"):
        print(f"{key:24s} {report[key]}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

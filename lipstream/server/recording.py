"""Write what a client received to MP4: the H.264 access units as they came (no re-encode) plus the audio."""

from __future__ import annotations

import tempfile
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from lipstream.audio.timeline import FPS, SAMPLE_RATE
from lipstream.errors import MediaError

AAC_FRAME = 1024


def write_received_mp4(path: Path, access_units: list[bytes], pcm: np.ndarray) -> int:
    """Remux Annex-B AUs (first one an IDR) at 25 fps with int16 16 kHz audio to AAC; return video frames."""
    if not access_units:
        raise MediaError("nothing to record: no video frames were received")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = path.with_name(f".{path.name}.partial")
    with tempfile.TemporaryDirectory(prefix="lipstream-rec-") as tmp:
        raw = Path(tmp) / "video.h264"
        raw.write_bytes(b"".join(access_units))
        try:
            written = _mux(raw, tmp_out, pcm)
        except BaseException:
            tmp_out.unlink(missing_ok=True)
            raise
    tmp_out.replace(path)
    return written


def _mux(raw: Path, out_path: Path, pcm: np.ndarray) -> int:
    video_tb = Fraction(1, FPS)
    with av.open(str(raw), format="h264") as src, av.open(str(out_path), "w", format="mp4") as out:
        in_stream = src.streams.video[0]
        v_out = out.add_stream_from_template(in_stream)
        a_out = out.add_stream("aac", rate=SAMPLE_RATE, layout="mono")
        a_out.bit_rate = 64_000
        audio = np.ascontiguousarray(pcm, dtype=np.int16)
        audio_pos = 0
        count = 0
        for packet in src.demux(in_stream):
            if packet.size == 0:
                continue
            packet.stream = v_out  # set first: assigning the stream resets the packet's time base
            packet.time_base = video_tb
            packet.pts = packet.dts = count
            packet.duration = 1
            out.mux(packet)
            count += 1
            # interleave: audio up to the end of this video frame
            target = min(len(audio), count * SAMPLE_RATE // FPS)
            audio_pos = _mux_audio(out, a_out, audio, audio_pos, target)
        _mux_audio(out, a_out, audio, audio_pos, len(audio))
        out.mux(a_out.encode(None))
    return count


def _mux_audio(out: av.container.OutputContainer, stream, audio: np.ndarray, start: int, end: int) -> int:
    pos = start
    while pos + AAC_FRAME <= end or (end == len(audio) and pos < end):
        chunk = audio[pos : min(pos + AAC_FRAME, end)]
        planar = (chunk.astype(np.float32) / 32768.0).reshape(1, -1)  # AAC takes float planar
        frame = av.AudioFrame.from_ndarray(planar, format="fltp", layout="mono")
        frame.sample_rate = SAMPLE_RATE
        frame.pts = pos
        frame.time_base = Fraction(1, SAMPLE_RATE)
        out.mux(stream.encode(frame))
        pos += len(chunk)
    return pos

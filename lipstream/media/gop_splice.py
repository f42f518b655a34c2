"""An H.264 MP4 assembled GOP by GOP: some GOPs copied from another file of the same settings, the others
encoded side by side on worker threads.

Mp4FrameWriter's files are made of closed GOPs (an IDR every `gop` frames, no B-frames, no scene cuts), so
each GOP decodes on its own and GOPs from separate encoder sessions of the same settings (the same SPS/PPS,
checked) follow each other in one stream. Preparing an avatar uses this for loop.mp4: the GOPs it shares
with footage.mp4 are copied, not encoded again, and the rest are encoded on both cores at once (one x264
session per GOP, one thread each, where one session with frame threads kept the cores only 70 % busy)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from lipstream.errors import MediaError
from lipstream.media.gop_video import FileWriter, VideoEncoding, x264_options
from lipstream.media.yuv import tag_bt601

Gop = list[av.Packet]


class GopSource:
    """The GOPs of an Mp4FrameWriter file by index, demuxed (nothing decoded) in one forward pass: only the
    GOP being read is held, so copying a long clip's late stretch does not hold the whole file."""

    def __init__(self, path: Path, gop: int) -> None:
        self.path = Path(path)
        self.gop = gop
        self._container = av.open(str(self.path))
        self._gops = self._demuxed()
        self._next = 0  # the index of the GOP `_gops` yields next

    def _demuxed(self) -> Iterator[Gop]:
        """The file's GOPs in order, each a key frame and the packets up to the next one."""
        gop: Gop = []
        for packet in self._container.demux(self._container.streams.video[0]):
            if packet.size == 0:  # the demuxer's end-of-stream marker
                continue
            if packet.is_keyframe and gop:
                yield gop
                gop = []
            if not gop and not packet.is_keyframe:
                raise MediaError(f"{self.path.name} does not start with a key frame")
            gop.append(packet)
        if gop:
            yield gop

    def read(self, index: int) -> Gop:
        """GOP `index`'s packets (indices ascending from call to call)."""
        if index < self._next:
            raise ValueError(f"GOP {index} of {self.path.name} was passed already")
        for gop in self._gops:
            self._next += 1
            if self._next - 1 == index:
                if len(gop) > self.gop:
                    raise MediaError(f"{self.path.name} has GOPs longer than {self.gop} frames")
                return gop
        raise MediaError(f"{self.path.name} has no GOP {index}")

    def close(self) -> None:
        """Close the file."""
        self._container.close()


def annexb_units(data: bytes) -> list[bytes]:
    """The NAL units of an Annex B byte stream (start codes 00 00 01 or 00 00 00 01 between them)."""
    codes = []  # each start code's position, found by bytes.find (a Python loop over every byte held the GIL
    k = data.find(b"\x00\x00\x01")  # for ~60 ms a megabyte of a GOP's packets)
    while k >= 0:
        codes.append(k)
        k = data.find(b"\x00\x00\x01", k + 3)
    # each unit up to the next code, less a 4-byte code's leading zero
    units = [data[a + 3 : b].rstrip(b"\x00") for a, b in zip(codes, codes[1:], strict=False)]
    if codes:
        units.append(data[codes[-1] + 3 :])
    return [u for u in units if u]


def avcc_parameter_sets(extradata: bytes) -> list[bytes]:
    """The SPS and PPS units of an MP4's avcC record, in order."""
    sets, k = [], 6
    for count_at_first in (True, False):
        count = extradata[5] & 0x1F if count_at_first else extradata[k - 1]
        for _ in range(count):
            size = int.from_bytes(extradata[k : k + 2], "big")
            sets.append(extradata[k + 2 : k + 2 + size])
            k += 2 + size
        k += 1  # the PPS count
    return sets


def length_prefixed(packet: av.Packet) -> av.Packet:
    """An encoder's Annex B packet as MP4 stores H.264 (each unit after its 4-byte length)."""
    out = av.Packet(b"".join(len(u).to_bytes(4, "big") + u for u in annexb_units(bytes(packet))))
    out.is_keyframe = packet.is_keyframe
    return out


def encode_gop(pictures: list[np.ndarray], coded_size: tuple[int, int], fps: int, encoding: VideoEncoding
               ) -> tuple[Gop, list[bytes]]:  # fmt: skip
    """One GOP of I420 pictures through a fresh x264 session of one thread: (packets as MP4 stores them, the
    session's SPS and PPS)."""
    context = av.CodecContext.create("libx264", "w")
    context.width, context.height = coded_size
    context.pix_fmt = "yuv420p"
    context.time_base = Fraction(1, fps)
    context.framerate = Fraction(fps, 1)
    context.flags |= av.codec.context.Flags.global_header  # SPS/PPS in extradata, as the MP4 muxer asks
    context.options = {**x264_options(encoding), "threads": "1"}
    tag_bt601(context)
    packets: Gop = []
    for k, picture in enumerate(pictures):
        frame = av.VideoFrame.from_ndarray(picture, format="yuv420p")
        frame.pts = k
        packets += context.encode(frame)
    packets += context.encode(None)
    return [length_prefixed(p) for p in packets], annexb_units(bytes(context.extradata or b""))


class GopAssembler(FileWriter):
    """Write `path` one GOP at a time, in order: `copy` one of `template`'s GOPs, or `encode` pictures (a
    whole GOP, or the file's last, shorter one) on a pool of `workers` threads. The stream's parameters and
    SPS/PPS are the template's; an encoded GOP whose SPS/PPS differ is refused (it would not decode)."""

    def __init__(
        self, path: Path, template: Path, encoding: VideoEncoding, fps: int, workers: int = 2
    ) -> None:
        self.path = Path(path)
        self.encoding = encoding
        self.fps = fps
        self.frames = 0
        self.copied_gops = 0
        self.encoded_gops = 0
        self._template = Path(template)
        self._source: GopSource | None = None
        with av.open(str(template)) as source:
            stream = source.streams.video[0]
            self.coded_size = (stream.codec_context.width, stream.codec_context.height)
            self._parameter_sets = avcc_parameter_sets(bytes(stream.codec_context.extradata or b""))
            options = {"movflags": "+faststart"}
            self._container = av.open(str(self.path), mode="w", format="mp4", options=options)
            self._stream = self._container.add_stream_from_template(stream)
        self._stream.time_base = Fraction(1, fps)
        self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix=f"{self.path.name} gop")
        self._pending: list[Future[tuple[Gop, list[bytes]]] | Gop] = []
        self._closed = False

    def copy(self, index: int) -> None:
        """Append GOP `index` of the template, as it is."""
        if self._source is None:
            self._source = GopSource(self._template, self.encoding.gop)
        self._pending.append(self._source.read(index))
        self.copied_gops += 1
        self._mux_ready()

    def encode(self, pictures: list[np.ndarray]) -> None:
        """Append one GOP encoded from I420 pictures at the coded size (on a worker thread)."""
        if not 0 < len(pictures) <= self.encoding.gop:
            raise ValueError(f"a GOP holds 1..{self.encoding.gop} pictures, got {len(pictures)}")
        job = self._pool.submit(encode_gop, pictures, self.coded_size, self.fps, self.encoding)
        self._pending.append(job)
        self.encoded_gops += 1
        self._mux_ready()

    def _mux_ready(self, wait: bool = False) -> None:
        """Write the GOPs at the front that are done (all of them, waiting, with `wait`)."""
        while self._pending:
            head = self._pending[0]
            if isinstance(head, Future):
                if not (wait or head.done()):
                    return
                packets, parameter_sets = head.result()
                if parameter_sets != self._parameter_sets:
                    raise MediaError(
                        f"an encoded GOP of {self.path.name} has SPS/PPS unlike {self._template.name}'s"
                    )
            else:
                packets = head
            self._pending.pop(0)
            for packet in packets:
                packet.stream = self._stream
                packet.time_base = Fraction(1, self.fps)
                packet.pts = packet.dts = self.frames
                packet.duration = 1
                self._container.mux(packet)
                self.frames += 1

    def close(self) -> None:
        """Wait for the encodes, write the rest and finish the file."""
        if self._closed:
            return
        self._closed = True
        try:
            self._mux_ready(wait=True)
        finally:
            self._release()

    def abort(self) -> None:
        """Stop after a failure (the partial file is the caller's to remove)."""
        self._closed = True
        self._release()

    def _release(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._container.close()
        if self._source is not None:
            self._source.close()

"""`lipstream client --converse`: ask an agent session a recorded question as a live microphone would, record
the avatar's answer, and measure the turn from the client's side."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import websockets
from pydantic import BaseModel, Field

from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.server.client import (
    ClientError,
    ClientReport,
    ReceivedEvent,
    _Recorder,
    open_session,
    save_recording,
)
from lipstream.server.protocol import Flags, Kind, MediaMessage, decode_media

CHUNK = 320  # 20 ms of microphone at 16 kHz, what the page sends
JITTER_SECONDS = 0.15  # the player's buffer before it starts playing (the page's, and sessions's)
POSITION_EVERY = 0.1  # seconds between `position` reports (the protocol asks for 100-250 ms)
EARLY_END_SAMPLES = 4800  # a turn ended 0.3 s or more before the question's speech did ended early
METRICS_GRACE = 3.0  # seconds to wait for turn_metrics once the answer has finished playing
WINDOW = 320  # energy windows of 20 ms for finding speech in the question
FLOOR_DBFS = -45.0  # quieter than this is never speech
BELOW_PEAK_DB = 30.0  # windows this far below the loudest one are silence


class ConverseReport(BaseModel):
    """What `client --converse` measured; times in ms on the client's clock."""

    url: str
    avatar: str
    question: str
    question_seconds: float
    codec: str = ""
    width: int = 0
    height: int = 0
    connect_ms: float = 0.0
    ready_ms: float = 0.0
    # where the user's speech ends, in samples of the microphone stream (16 kHz since the first pcm chunk):
    # found in the WAV by an energy threshold (the client's own, server-independent figure, used below), and
    # as the server's VAD placed it (user_speech_ended.mic_samples), for comparison
    speech_end_samples: int = 0
    server_speech_end_samples: int | None = None
    # the latencies, from the moment the pcm chunk holding the last speech sample left the client:
    speech_end_to_first_frame_ms: float | None = None  # -> first speech frame of the answer received
    speech_end_to_first_frame_due_ms: float | None = None  # -> when a player (150 ms jitter buffer) shows it
    # the same from the server's end of speech (its mic_samples mapped onto the client's send clock)
    server_speech_end_to_first_frame_ms: float | None = None
    # from the arrival of user_speech_ended (the end-of-turn silence is policy, not overhead)
    end_of_turn_to_first_frame_ms: float | None = None
    first_frame_pts: int | None = None
    player_stall_ms: float = 0.0  # how long the simulated player waited for late frames in the whole session
    transcripts: list[dict[str, Any]] = Field(default_factory=list)  # turn, kind, text, at_ms
    final_transcript: str | None = None
    # turn, utterance_id, position_samples, text, at_ms
    reply_texts: list[dict[str, Any]] = Field(default_factory=list)
    reply: str = ""
    turn_metrics: dict[str, Any] | None = None  # the server's message for the answered turn
    # what ended the user's turn (user_speech_ended.rule: detector, max_wait, silence, turn_limit) and the
    # turn detector's score; every turn_decision the server sent (a detector judging a pause)
    end_rule: str | None = None
    end_score: float | None = None
    turn_decisions: list[dict[str, Any]] = Field(default_factory=list)
    # the server ended the user's turn before the speech was over (a pause taken for the end), and the
    # avatar's answer started before it was over
    early_turn_ends: int = 0
    answered_early: bool = False
    interrupted: bool | None = None
    frames_recorded: int = 0
    speech_frames: int = 0
    pts_continuous: bool = True
    audio_matches_video: bool = True
    duration_seconds: float = 0.0
    events: list[ReceivedEvent] = Field(default_factory=list)  # every control message; at_ms since mic start
    errors: list[dict[str, Any]] = Field(default_factory=list)
    barge_in_ms: float | None = None  # measured in the browser test, not here
    # the server had every seat taken (a `state` with agent "waiting"): when the visitor, after the speech
    # end, saw it (a state event) and heard it (the wait line's first speech frame), and their places in line
    waited: bool = False
    speech_end_to_wait_seen_ms: float | None = None
    speech_end_to_wait_heard_ms: float | None = None
    queue_positions: list[int] = Field(default_factory=list)
    out: str | None = None


def find_speech_end(pcm: np.ndarray) -> int:
    """The sample after the last 20 ms window loud enough to be speech (energy threshold); 0 when none is."""
    windows = len(pcm) // WINDOW
    if windows == 0:
        return 0
    frames = pcm[: windows * WINDOW].astype(np.float64).reshape(windows, WINDOW)
    rms = np.sqrt(np.mean(frames**2, axis=1))
    peak = float(rms.max())
    threshold = max(10 ** (FLOOR_DBFS / 20), peak * 10 ** (-BELOW_PEAK_DB / 20))
    loud = np.flatnonzero(rms > threshold)
    return 0 if len(loud) == 0 else int(loud[-1] + 1) * WINDOW


@dataclass
class _Turn:
    """The state shared by the sender and the receiver."""

    report: ConverseReport
    t0: float  # when the first microphone chunk left (perf_counter)
    speech_end: int
    sent_at: list[float] = field(default_factory=list)  # send time of each chunk, by chunk index
    stats: ClientReport | None = None
    recorder: _Recorder = field(default_factory=_Recorder)
    armed_at: float | None = None  # the question is over: record from the next keyframe
    player_t0: float | None = None  # the player clock starts on the first media + the jitter buffer
    first_pts: int | None = None
    stalled: float = 0.0  # seconds the player waited for late frames (its clock stops while it does)
    first_frame_due: float | None = None
    answer_uid: int | None = None
    answer_turn: int | None = None
    first_frame_at: float | None = None
    finished_at: float | None = None
    end_of_turn_at: float | None = None
    wait_seen_at: float | None = None
    wait_heard_at: float | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def playing_pts(self, now: float) -> int | None:
        """The pts the simulated player is playing at `now`, or None before it starts."""
        if self.player_t0 is None or self.first_pts is None or now < self.player_t0:
            return None
        return self.first_pts + int((now - self.player_t0 - self.stalled) * SAMPLE_RATE)

    def due(self, pts: int, now: float) -> float:
        """When the player shows the frame `pts` that arrived at `now`: on its clock, or at once when late
        (the player stalls until it comes, and its clock resumes from there)."""
        assert self.player_t0 is not None and self.first_pts is not None
        due = self.player_t0 + self.stalled + (pts - self.first_pts) / SAMPLE_RATE
        if now > due:
            self.stalled += now - due
            return now
        return due

    def chunk_time(self, sample: int) -> float | None:
        """When the chunk holding `sample` left the client."""
        index = max(0, sample - 1) // CHUNK
        return self.sent_at[index] if index < len(self.sent_at) else None


def load_question(path: Path) -> np.ndarray:
    """The question as float32 mono 16 kHz; a one-line ClientError when it cannot be read or is silent."""
    from lipstream.audio.decode import load_audio
    from lipstream.errors import LipstreamError

    try:
        pcm = load_audio(path)
    except LipstreamError as exc:
        raise ClientError(f"cannot read the question {path}: {exc}") from None
    if find_speech_end(pcm) == 0:
        raise ClientError(f"the question {path} holds no speech (only silence); record a spoken question")
    return pcm


async def run_converse(
    url: str,
    avatar: str,
    question: Path,
    out: Path | None = None,
    token: str | None = None,
    output_width: int | None = None,
    timeout: float = 120.0,
    stream: str = "full",
) -> ConverseReport:
    """Open an agent session, stream `question` as a live microphone, record the answer; return the report.

    `timeout`: seconds after the question's end to wait for the answer to finish playing; `stream`: "patch"
    asks for the page's mouth-patch stream (its patches are timed, not recorded)."""
    pcm = load_question(Path(question))
    speech_end = find_speech_end(pcm)
    report = ConverseReport(
        url=url, avatar=avatar, question=str(question), question_seconds=round(len(pcm) / SAMPLE_RATE, 3),
        speech_end_samples=speech_end,
    )  # fmt: skip
    try:
        opened = open_session(url, avatar, report, token, output_width, agent=True, stream=stream)
        async with opened as (ws, ready):
            if ready.get("agent") is not True:
                raise ClientError(
                    f"the server at {url} has no conversational agent (ready.agent is not true); "
                    "start it with `lipstream serve --agent`"
                )
            turn = _Turn(report=report, t0=time.perf_counter(), speech_end=speech_end)
            turn.stats = ClientReport(url=url, avatar=avatar)
            await _both(_talk(ws, turn, pcm, timeout), _receive(ws, turn))
    except (OSError, websockets.exceptions.InvalidHandshake) as exc:
        raise ClientError(f"cannot connect to {url}: {exc}") from None
    except asyncio.TimeoutError:
        raise ClientError("the server sent no `ready` within 60 s") from None
    except websockets.exceptions.ConnectionClosed as exc:
        raise ClientError(f"server closed the session: {exc}") from None
    _summarise(turn)
    if out is not None:
        save_recording(Path(out), turn.recorder)
        report.out = str(out)
    return report


async def _both(*coros: Any) -> None:
    """Run the sender and the receiver; the first to fail cancels the other and its error is raised."""
    tasks = [asyncio.create_task(c) for c in coros]
    try:
        for finished in asyncio.as_completed(tasks):
            await finished  # raises the first failure
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(BaseException):
                await task


async def _talk(ws: Any, turn: _Turn, pcm: np.ndarray, timeout: float) -> None:
    """Send the question then silence in 20 ms chunks at real-time pace, with position reports; the only
    task that sends, so messages never interleave."""
    samples = np.clip(pcm * 32767, -32768, 32767).astype("<i2")
    silence = np.zeros(CHUNK, "<i2").tobytes()
    deadline: float | None = None
    last_position = 0.0
    index = 0
    while not turn.done.is_set():
        start = index * CHUNK
        # a live microphone sends a chunk once it has been captured: chunk i leaves at (i + 1) x 20 ms
        await asyncio.sleep(max(0.0, turn.t0 + (index + 1) * CHUNK / SAMPLE_RATE - time.perf_counter()))
        body = samples[start : start + CHUNK].tobytes() if start < len(samples) else silence
        if len(body) < CHUNK * 2:
            body += bytes(CHUNK * 2 - len(body))
        await ws.send(MediaMessage(Kind.PCM, body, aux=SAMPLE_RATE).encode())
        now = time.perf_counter()
        turn.sent_at.append(now)
        index += 1
        if turn.armed_at is None and index * CHUNK >= turn.speech_end:
            turn.armed_at = now  # the question is over: the recording starts at the next frame, an IDR
            await ws.send(json.dumps({"type": "keyframe"}))
        if start + CHUNK >= len(samples) and deadline is None:
            deadline = now + timeout
        playing = turn.playing_pts(now)
        if playing is not None and now - last_position >= POSITION_EVERY:
            await ws.send(json.dumps({"type": "position", "pts": playing}))
            last_position = now
        if deadline is not None and now > deadline:
            raise ClientError(
                f"the answer did not finish within {timeout:g} s of the question's end "
                f"({_progress(turn.report)})"
            )


def _progress(report: ConverseReport) -> str:
    """How far the turn got, for a timeout message."""
    seen = [e.message.get("type") for e in report.events]
    if "user_speech_started" not in seen:
        return "the server never heard speech"
    if "user_speech_ended" not in seen:
        return "the server never heard the speech end"
    if report.final_transcript is None:
        return "no final transcript"
    if not report.reply_texts:
        return f"heard {report.final_transcript!r}, but no answer came"
    return "the answer started but never finished"


async def _receive(ws: Any, turn: _Turn) -> None:
    """Record frames and events until the answer has played and its turn_metrics arrived (or a grace)."""
    report = turn.report
    while True:
        try:
            data = await asyncio.wait_for(ws.recv(), 0.25)
        except asyncio.TimeoutError:
            data = None
        now = time.perf_counter()
        at_ms = round((now - turn.t0) * 1000, 2)
        if isinstance(data, bytes):
            _on_media(turn, decode_media(data), now)
        elif isinstance(data, str):
            _on_control(turn, json.loads(data), now, at_ms)
        if turn.finished_at is not None and (
            report.turn_metrics is not None or now - turn.finished_at > METRICS_GRACE
        ):
            turn.done.set()
            return


def _on_media(turn: _Turn, msg: MediaMessage, now: float) -> None:
    if turn.player_t0 is None:
        turn.player_t0, turn.first_pts = now + JITTER_SECONDS, msg.pts
    due = turn.due(msg.pts, now) if msg.kind in (Kind.VIDEO, Kind.PATCH) else None
    if turn.armed_at is None or turn.finished_at is not None:
        return
    speaking = msg.kind in (Kind.VIDEO, Kind.PATCH) and msg.flags & Flags.SPEAKING
    # the answer's frames come after its first reply_text; speech before it is not the answer (the wait
    # line of a visitor in line, the end of a greeting)
    if speaking and turn.answer_uid is None and turn.report.waited and turn.wait_heard_at is None:
        turn.wait_heard_at = now
    if speaking and turn.answer_uid is not None and turn.first_frame_at is None:
        turn.first_frame_at, turn.first_frame_due = now, due
        turn.report.first_frame_pts = msg.pts
    assert turn.stats is not None
    if msg.kind != Kind.PATCH:  # a patch is the mouth alone: the recording is of whole frames
        turn.recorder.add(msg, turn.stats, 0.0)


def _on_control(turn: _Turn, message: dict[str, Any], now: float, at_ms: float) -> None:
    report = turn.report
    report.events.append(ReceivedEvent(at_ms=at_ms, message=message))
    kind = message.get("type")
    if kind == "error":
        report.errors.append(message)
        if message.get("fatal"):
            raise ClientError(f"server error ({message.get('code')}): {message.get('message')}")
    elif kind == "user_speech_ended":  # the last one counts: a turn ended early may be continued
        turn.end_of_turn_at = now
        report.server_speech_end_samples = message.get("mic_samples")
        report.end_rule, report.end_score = message.get("rule"), message.get("score")
        if (report.server_speech_end_samples or 0) < report.speech_end_samples - EARLY_END_SAMPLES:
            report.early_turn_ends += 1
    elif kind == "turn_decision":
        report.turn_decisions.append({**_without_type(message), "at_ms": at_ms})
    elif kind == "transcript":
        report.transcripts.append({**_without_type(message), "at_ms": at_ms})
        if message.get("kind") == "final":
            report.final_transcript = message.get("text")
    elif kind == "reply_text":
        report.reply_texts.append({**_without_type(message), "at_ms": at_ms})
        turn.answer_turn = message.get("turn") if turn.answer_turn is None else turn.answer_turn
        if turn.answer_uid is None:  # sent before the frames it labels: the answer's utterance
            turn.answer_uid = message.get("utterance_id")
    elif kind == "state" and message.get("agent") == "waiting":
        report.waited = True
        report.queue_positions.append(int(message.get("queue_position") or 0))
        if turn.armed_at is not None and turn.wait_seen_at is None:
            turn.wait_seen_at = now
    elif kind == "playback_finished" and turn.answer_uid is not None and turn.finished_at is None:
        if message.get("utterance_id") == turn.answer_uid:
            turn.finished_at = now
            report.interrupted = bool(message.get("interrupted"))
    elif kind == "turn_metrics" and report.turn_metrics is None:
        if turn.answer_turn is None or message.get("turn") == turn.answer_turn:
            report.turn_metrics = _without_type(message)


def _without_type(message: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k != "type"}


def _ms(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round((b - a) * 1000, 1)


def _summarise(turn: _Turn) -> None:
    """The client-side latencies and the recording's continuity, into the report."""
    report, stats = turn.report, turn.stats
    assert stats is not None
    report.reply = " ".join(r.get("text", "") for r in report.reply_texts).strip()
    end_at = turn.chunk_time(turn.speech_end)
    report.speech_end_to_first_frame_ms = _ms(end_at, turn.first_frame_at)
    first = turn.first_frame_at
    report.answered_early = first is not None and end_at is not None and first < end_at
    report.speech_end_to_first_frame_due_ms = _ms(end_at, turn.first_frame_due)
    report.player_stall_ms = round(turn.stalled * 1000, 1)
    if report.server_speech_end_samples is not None:
        server_end_at = turn.chunk_time(report.server_speech_end_samples)
        report.server_speech_end_to_first_frame_ms = _ms(server_end_at, turn.first_frame_at)
    report.end_of_turn_to_first_frame_ms = _ms(turn.end_of_turn_at, turn.first_frame_at)
    report.speech_end_to_wait_seen_ms = _ms(end_at, turn.wait_seen_at)
    report.speech_end_to_wait_heard_ms = _ms(end_at, turn.wait_heard_at)
    report.frames_recorded = stats.frames_received
    report.speech_frames = stats.speech_frames
    report.pts_continuous = stats.pts_continuous
    report.audio_matches_video = stats.audio_matches_video
    report.duration_seconds = round(stats.frames_received / 25.0, 3)

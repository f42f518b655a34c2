"""Utterance edges: the lips leave the footage's own mouth and return to it over a few frames, not in one."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from lipstream.engines.base import Engine
from lipstream.engines.viseme.articulation import CLOSURE, OPEN
from lipstream.engines.viseme.edges import EdgeConfig, ease_onset, release_rows
from lipstream.render.frames import AvatarFrame
from lipstream.render.session import RenderSession, SessionConfig, SessionEvent
from lipstream.render.utterance_easing import UtteranceEasing

EDGES = EdgeConfig(frames=3)  # explicit: the tests below do not follow a changed default


def test_the_closure_eases_in_and_the_last_row_eases_out() -> None:
    closed = np.tile(np.array([0.0, 0.0, 1.0, 0.0], np.float32), (6, 1))
    eased = ease_onset(closed, 0, EDGES)
    assert np.allclose(eased[:, CLOSURE], [0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    assert np.array_equal(ease_onset(closed, EDGES.frames, EDGES), closed)  # later rows: as they were
    voiced = np.array([[0.6, 0.2, 0.0, 0.0]], np.float32)
    assert np.array_equal(ease_onset(voiced, 0, EDGES), voiced)  # an opening is drawn from the footage as is
    tail = release_rows(np.array([0.6, 0.2, 0.8, 0.0], np.float32), EDGES)
    assert tail.shape == (EDGES.frames, 4) and tail.dtype == np.float32
    assert np.allclose(tail[:, OPEN], [0.45, 0.3, 0.15]) and np.allclose(tail[:, CLOSURE], [0.6, 0.4, 0.2])


class _Plain(Engine):
    """An engine that keeps the Engine's default `onset`/`release` (as MuseTalk): nothing is eased."""


def test_an_engine_without_edges_passes_through_and_a_drawn_row_is_what_is_released() -> None:
    rows = np.ones((3, 4), np.float32)
    plain = UtteranceEasing(_Plain())
    assert np.array_equal(plain.speech(1, rows, 0, 10), rows)
    plain.finished(12)
    assert plain.idle_row() is None

    from lipstream.engines.viseme.engine import VisemeEngine

    edges = UtteranceEasing(VisemeEngine(edges=EDGES))
    eased = edges.speech(1, rows, 0, 10)
    assert eased[0, CLOSURE] < 1.0
    for tick in (10, 11):
        edges.shown(tick, drawn=True)
    edges.shown(12, drawn=False)  # accelerated silence shows the footage: nothing to ease back from
    edges.finished(12)
    assert edges.idle_row() is None
    edges.interrupted(12)  # cut after frame 11, which was drawn: ease back from its row
    tail = [edges.idle_row() for _ in range(EDGES.frames + 1)]
    assert all(r is not None for r in tail[:-1]) and tail[-1] is None
    assert np.allclose(tail[0], eased[1] * 0.75)
    # rows past a cut go with it: a later interrupt while idle on those ticks finds no mouth never seen
    edges.speech(3, rows, 0, 30)
    for tick in (30, 31, 32):  # made before the cut, dropped by it but 30
        edges.shown(tick, drawn=True)
    edges.interrupted(31)  # cut after 30: eases back from its row
    assert sum(edges.idle_row() is not None for _ in range(EDGES.frames + 1)) == EDGES.frames
    edges.interrupted(33)  # tick 32 was dropped by the first cut
    assert edges.idle_row() is None
    # an utterance that follows another's tail does not ease in again (its lips were not at rest)
    edges.interrupted(12)
    edges.idle_row()
    assert np.array_equal(edges.speech(2, rows, 0, 20), rows)


@pytest.fixture(scope="module")
def quiet_ended_speech() -> np.ndarray:
    """espeak-ng speech with 0.3 s of silence before and after it (16 kHz float32)."""
    from lipstream.talk.voices.tts import create_tts

    pcm = create_tts("espeak").synthesize("The bridge reopened today.").pcm.astype(np.float32)
    pause = np.zeros(int(0.3 * 16000), np.float32)
    return np.concatenate([pause, pcm, pause])


def _mouth_distance(small_avatar, frames: list[AvatarFrame]) -> np.ndarray:
    """Mean absolute difference of each frame from the footage it was drawn on, in the face's lower half."""
    out = []
    for f in frames:
        base = np.asarray(small_avatar.frames[f.base_index]).astype(np.int16)
        x0, y0, x1, y1 = (int(v) for v in small_avatar.boxes[f.base_index])
        lower = slice((y0 + y1) // 2, y1), slice(x0, x1)
        out.append(float(np.abs(f.image[lower].astype(np.int16) - base[lower]).mean()))
    return np.array(out)


def test_a_live_session_eases_into_and_out_of_the_footage(small_avatar, quiet_ended_speech) -> None:
    from lipstream.engines.viseme.engine import VisemeEngine

    async def run() -> list:
        items: list = []
        engine = VisemeEngine(edges=EDGES)
        async with RenderSession(small_avatar, engine, SessionConfig(encode=False)) as session:
            for _ in range(4):  # idle first: the utterance starts from the footage's own mouth
                items.append(await session.__aiter__().__anext__())
            session.push_audio(quiet_ended_speech)
            session.flush()
            async for item in session:
                items.append(item)
                if isinstance(item, SessionEvent) and item.type == "playback_finished":
                    break
            for _ in range(EDGES.frames + 4):
                items.append(await session.__aiter__().__anext__())
        return [i for i in items if isinstance(i, AvatarFrame)]

    frames = asyncio.run(run())
    distance = _mouth_distance(small_avatar, frames)
    speaking = np.array([f.speaking for f in frames])
    first, last = int(np.argmax(speaking)), len(speaking) - 1 - int(np.argmax(speaking[::-1]))
    assert not distance[:first].any()  # idle before: the footage itself
    # the leading silence closes the lips over EDGES.frames + 1 frames, each step further from the footage
    onset = distance[first : first + EDGES.frames + 1]
    assert all(a < b for a, b in zip(onset, onset[1:], strict=False)), onset
    # after the speech: idle frames (silent, not speaking) carry the closed lips back, each nearer the footage
    tail = distance[last : last + EDGES.frames + 2]
    assert not any(f.speaking or f.audio.any() for f in frames[last + 1 :])
    assert all(a > b for a, b in zip(tail, tail[1:], strict=False)), tail
    assert tail[-1] == 0.0 and not distance[last + EDGES.frames + 1 :].any()  # then the footage itself
    assert (distance[last + 1 :] > 0).sum() == EDGES.frames

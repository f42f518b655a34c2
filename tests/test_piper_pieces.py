"""The Piper voice in two stages (issue 48): a sentence made a piece at a time joins into the sentence made
whole, sample for sample, with its words and phoneme timings; a model that cannot be cut, or a damaged cached
stage, still gives a working voice."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from lipstream.audio.speech import Speech
from lipstream.talk.voices import piper_stages
from lipstream.talk.voices.phonemes import word_gaps
from lipstream.talk.voices.piper_pieces import LIMIT_KNEE, soft_limit
from lipstream.talk.voices.piper_stages import FIRST_PIECE_FRAMES, piece_bounds, split_model, staged_names
from lipstream.talk.voices.piper_tts import PiperTTS
from lipstream.talk.voices.speaker import Speaker

LONG = (
    "The museum on the hill will open late on Fridays this summer with live music in the garden and free "
    "entry for children under twelve."
)


def test_pieces_cover_a_sentence_from_a_short_first_one() -> None:
    for frames in (1, 31, 32, 63, 64, 65, 200, 562, 3000):
        bounds = piece_bounds(frames)
        assert bounds[0][0] == 0 and bounds[-1][1] == frames
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
        assert bounds[0][1] - bounds[0][0] <= 2 * FIRST_PIECE_FRAMES  # short first, or the whole short one
        assert all(end - start >= FIRST_PIECE_FRAMES for start, end in bounds[1:])  # no sliver at the end


def test_the_limiter_bends_only_what_is_over_its_knee() -> None:
    audio = np.linspace(-1.6, 1.6, 3201, dtype=np.float32)
    limited = soft_limit(audio)
    quiet = np.abs(audio) <= LIMIT_KNEE
    assert np.array_equal(limited[quiet], audio[quiet])
    assert np.abs(limited).max() < 1.0 and np.all(np.diff(limited) >= 0)  # never past full range, no folds


@pytest.fixture(scope="module")
def piper() -> PiperTTS:
    return PiperTTS(threads=1)


@pytest.mark.slow
def test_a_sentence_in_pieces_is_the_sentence_made_whole(piper: PiperTTS) -> None:
    assert piper.speaks_in_pieces()
    pieces = list(piper.synthesize_sentences(LONG))
    whole = piper.synthesize(LONG)
    assert len(pieces) >= 3 and pieces[0].seconds <= 0.25  # the first piece is short
    joined = np.concatenate([p.pcm for p in pieces])
    assert joined.shape == whole.pcm.shape
    # the same waveform but for its scale (the first piece's peak, not the whole sentence's) and the limiter
    scale = float(np.dot(joined, whole.pcm) / np.dot(joined, joined))
    # (a limited sample's neighbours move a little too: the resampler spreads it)
    residual = np.abs(joined * scale - whole.pcm)[np.abs(joined) < LIMIT_KNEE - 0.1]
    assert residual.max() < 2.5e-3, residual.max()
    assert 0.7 < scale <= 1.0 and np.abs(joined).max() <= 1.0
    assert " ".join(p.text for p in pieces if p.text) == LONG
    # the pieces' phoneme timings, moved back to the sentence's clock and a phoneme cut at a join made one
    # again, are the whole sentence's
    offsets = [int(o) for o in np.cumsum([0] + [len(p.pcm) for p in pieces])]
    timings: list[tuple[str, int, int]] = []
    for piece, offset in zip(pieces, offsets, strict=False):
        for t in piece.phonemes:
            symbol, start, end = t.phoneme, t.start + offset, t.end + offset
            if timings and start == offset and timings[-1][0] == symbol and timings[-1][2] == start:
                start = timings.pop()[1]
            timings.append((symbol, start, end))
    assert timings == [(t.phoneme, t.start, t.end) for t in whole.phonemes]


@pytest.mark.slow
def test_a_speaker_leaves_the_text_whole_for_a_voice_in_pieces(piper: PiperTTS) -> None:
    async def speak() -> list[Speech]:
        return [s async for s in await Speaker(voices=lambda _name: piper).speak(LONG, quick_start=True)]

    speeches = asyncio.run(speak())
    assert speeches[0].seconds <= 0.25
    assert " ".join(s.text for s in speeches if s.text) == LONG  # no comma read into it, no word lost


def test_a_model_without_the_stage_tensors_is_not_cut(tmp_path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["input"], ["output"])],
        "other-export",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1])],
    )
    model = tmp_path / "other.onnx"
    onnx.save(helper.make_model(graph), str(model))
    assert split_model(model) is None
    assert piper_stages.staged_voice(model, 256, lambda _part: None) is None


@pytest.mark.slow
def test_a_voice_that_cannot_be_cut_speaks_whole_sentences(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(piper_stages, "PRIOR", "/no_such_tensor")
    voice = PiperTTS(threads=1)
    assert not voice.speaks_in_pieces()
    assert [s.text for s in voice.synthesize_sentences(LONG)] == [LONG]

    async def speak() -> list[Speech]:
        return [s async for s in await Speaker(voices=lambda _name: voice).speak(LONG, quick_start=True)]

    assert len(asyncio.run(speak())) == 2  # the text cut at its first phrase instead


@pytest.mark.slow
def test_a_damaged_cached_stage_is_cut_again(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    PiperTTS(threads=1)
    aligned = next((tmp_path / "lipstream" / "piper").glob("*-aligned.onnx"))
    text_side, frames_side = staged_names(aligned)
    assert text_side.stat().st_size > 1_000_000 and frames_side.stat().st_size > 1_000_000
    frames_side.write_bytes(b"not an onnx model")
    voice = PiperTTS(threads=1)
    assert voice.speaks_in_pieces() and "cutting them again" in caplog.text
    assert voice.synthesize("Hello there.").phonemes is not None
    assert frames_side.stat().st_size > 1_000_000


def test_word_gaps_are_the_runs_between_words() -> None:
    assert word_gaps(list("ab c, de.")) == [(2, 3), (4, 6)]  # the mark at the end is between no words
    assert word_gaps(list(" ab")) == []  # a run at the very start is no gap between words


@pytest.mark.slow
def test_a_long_first_sentence_starts_from_its_head_and_joins_the_rest_in_a_gap(
    piper: PiperTTS, monkeypatch
) -> None:
    staged = piper._staged
    prior_ids: list[int] = []  # the text side's runs, in order: (ids read)
    real_prior = staged.prior
    monkeypatch.setattr(
        staged, "prior", lambda ids, scales: prior_ids.append(len(ids)) or real_prior(ids, scales)
    )
    quick = piper.synthesize_sentences(LONG, quick_start=True)
    first = next(quick)
    head_ids = list(prior_ids)
    pieces = [first, *quick]
    # the first piece waited for the text side of the head only; the whole sentence's ran after it
    assert len(head_ids) == 1 and len(prior_ids) == 2 and head_ids[0] < prior_ids[1] / 2
    whole = piper.synthesize(LONG)
    assert first.seconds <= 0.25 and first.text == LONG and " ".join(p.text for p in pieces if p.text) == LONG
    joined = np.concatenate([p.pcm for p in pieces])
    assert abs(len(joined) - len(whole.pcm)) < 0.05 * len(whole.pcm)  # the head's durations differ a little
    assert abs(first.text_samples - len(joined)) < 0.15 * len(joined)  # the caption's length, estimated
    # the join falls in a gap between words: no step there larger than the sentence's own largest ones
    cut = piper.head_samples(LONG)
    steps = np.abs(np.diff(joined))
    assert steps[cut - 32 : cut + 400].max() <= np.percentile(np.abs(np.diff(whole.pcm)), 99.9)
    # every phoneme is said, once and in order (a phone split across two pieces counted once)
    said = [t for p in pieces for t in p.phonemes]
    symbols = [t.phoneme for t in said if t.phoneme.strip()]
    expected = [t.phoneme for t in whole.phonemes if t.phoneme.strip()]
    assert [s for i, s in enumerate(symbols) if i == 0 or s != symbols[i - 1]] == [
        s for i, s in enumerate(expected) if i == 0 or s != expected[i - 1]
    ]


@pytest.mark.slow
def test_a_short_sentence_or_no_quick_start_has_no_head(piper: PiperTTS) -> None:
    short = "Welcome to the evening news."
    assert piper.head_samples(short) is None
    plain = np.concatenate([p.pcm for p in piper.synthesize_sentences(short)])
    quick = np.concatenate([p.pcm for p in piper.synthesize_sentences(short, quick_start=True)])
    assert np.array_equal(plain, quick)
    # a long sentence after the first is made whole: only the first one's start is waited for
    text = f"{short} {LONG}"
    assert np.array_equal(
        np.concatenate([p.pcm for p in piper.synthesize_sentences(text)]),
        np.concatenate([p.pcm for p in piper.synthesize_sentences(text, quick_start=True)]),
    )

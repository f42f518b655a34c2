"""The Piper voice patched for phoneme alignments is written once to the user's cache and read from there:
the same audio and timings as piper's own in-memory patch; a damaged cached copy or a cache that cannot be
written still gives a working voice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lipstream.talk.voices import piper_aligned
from lipstream.talk.voices.piper_tts import PiperTTS, bundled_voice_path

pytestmark = pytest.mark.slow  # Piper loads
TEXT = "Hello there, how are you today?"


def _cached(cache: Path) -> list[Path]:
    return sorted((cache / "lipstream" / "piper").glob("*-aligned.onnx"))


def test_the_patched_voice_is_cached_and_speaks_as_pipers_own_patch(tmp_path, monkeypatch) -> None:
    from piper import PiperVoice, SynthesisConfig

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    first = PiperTTS(threads=1, in_pieces=False)
    cached = _cached(tmp_path)
    assert len(cached) == 1 and not list(cached[0].parent.glob("*.part"))
    written = cached[0].stat().st_mtime_ns

    def no_patching(model: Path) -> bytes:
        raise AssertionError("the cached voice was patched again")

    monkeypatch.setattr(piper_aligned, "patched_bytes", no_patching)
    again = PiperTTS()
    assert cached[0].stat().st_mtime_ns == written

    reference = PiperVoice.load(bundled_voice_path(), include_alignments=True)  # piper's in-memory patch
    config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0)
    chunks = list(reference.synthesize(TEXT, syn_config=config, include_alignments=True))
    expected = np.concatenate([c.audio_float_array for c in chunks])
    speech = first.synthesize(TEXT)
    assert speech.phonemes is not None and len(speech.phonemes) > 10
    raw = np.concatenate([c.audio_float_array for c in first._chunks(TEXT)])
    assert raw.shape == expected.shape and np.abs(raw - expected).max() < 1e-4
    assert [a.phoneme for c in first._chunks(TEXT) for a in c.phoneme_alignments] == [
        a.phoneme for c in chunks for a in c.phoneme_alignments
    ]
    # the voice in stages (piper_stages): the same samples and the same phones, from the same cached copy
    assert again.speaks_in_pieces()
    staged = again.synthesize(TEXT)
    assert staged.pcm.shape == speech.pcm.shape and np.abs(staged.pcm - speech.pcm).max() < 1e-4
    assert staged.phonemes == speech.phonemes


def test_a_damaged_cached_copy_is_dropped_and_the_voice_still_loads(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = tmp_path / "lipstream" / "piper"
    folder.mkdir(parents=True)
    damaged = folder / piper_aligned.aligned_name(bundled_voice_path())
    damaged.write_bytes(b"not an onnx model")
    voice = PiperTTS()
    assert voice.synthesize(TEXT).phonemes is not None
    assert "did not load" in caplog.text and not damaged.exists()
    PiperTTS()  # the next load writes a good copy
    assert damaged.stat().st_size > 10_000_000


def test_a_cache_that_cannot_be_written_patches_in_memory(tmp_path, monkeypatch) -> None:
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert isinstance(piper_aligned.aligned_model(bundled_voice_path()), bytes)
    assert PiperTTS(threads=1).synthesize(TEXT).phonemes is not None

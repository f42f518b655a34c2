"""espeak-ng through libespeak-ng (ctypes), with phoneme events in IPA: the light fallback voice."""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
from collections.abc import Iterator
from ctypes import (
    CFUNCTYPE,
    POINTER,
    Structure,
    Union,
    c_char,
    c_char_p,
    c_int,
    c_short,
    c_ubyte,
    c_uint,
    c_void_p,
)

import numpy as np

from lipstream.audio.decode import resample, to_float32
from lipstream.audio.speech import Speech
from lipstream.errors import SpeechError
from lipstream.talk.text import check_text, split_sentences
from lipstream.talk.voices.phonemes import PAUSE, RawPhone, merge_phones, to_timings

# Constants from espeak-ng's speak_lib.h.
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INIT_PHONEME_EVENTS = 0x1
_INIT_PHONEME_IPA = 0x2
_POS_CHARACTER = 1
_CHARS_UTF8 = 0x1
_ENDPAUSE = 0x1000
_EVENT_LIST_TERMINATED = 0
_EVENT_PHONEME = 7

# libespeak-ng keeps one synthesiser per process; every EspeakTTS object shares it, so calls are serialised.
_PROCESS_LOCK = threading.Lock()


class _EventId(Union):
    _fields_ = [("number", c_int), ("name", c_char_p), ("string", c_char * 8)]


class _Event(Structure):
    _fields_ = [
        ("type", c_int),
        ("unique_identifier", c_uint),
        ("text_position", c_int),
        ("length", c_int),
        ("audio_position", c_int),
        ("sample", c_int),
        ("user_data", c_void_p),
        ("id", _EventId),
    ]


class _VoiceSpec(Structure):
    _fields_ = [
        ("name", c_char_p),
        ("languages", c_char_p),
        ("identifier", c_char_p),
        ("gender", c_ubyte),
        ("age", c_ubyte),
        ("variant", c_ubyte),
        ("xx1", c_ubyte),
        ("score", c_int),
        ("spare", c_void_p),
    ]


_SynthCallback = CFUNCTYPE(c_int, POINTER(c_short), c_int, POINTER(_Event))


class _Capture:
    """Collects the audio chunks and phoneme starts that libespeak-ng hands to the callback."""

    def __init__(self) -> None:
        self.audio: list[np.ndarray] = []
        self.phones: list[tuple[str, int]] = []  # (IPA name, start sample)

    def __call__(self, wav, n_samples: int, events) -> int:  # noqa: ANN001 - ctypes pointers
        if n_samples > 0:
            self.audio.append(np.ctypeslib.as_array(wav, shape=(n_samples,)).copy())
        i = 0
        while events[i].type != _EVENT_LIST_TERMINATED:
            event = events[i]
            if event.type == _EVENT_PHONEME:
                name = event.id.string.decode("utf-8", errors="replace")
                self.phones.append((name or PAUSE, int(event.sample)))
            i += 1
        return 0  # 0 = continue synthesis


class EspeakTTS:
    """Rule-based TTS from Debian's espeak-ng: fast, deterministic, robotic. voice: an espeak-ng voice."""

    name = "espeak"

    def __init__(self, voice: str = "en-us", library: str | None = None) -> None:
        """Open libespeak-ng and check the voice exists."""
        path = library or ctypes.util.find_library("espeak-ng") or "libespeak-ng.so.1"
        try:
            self._lib = ctypes.CDLL(path)
        except OSError as exc:
            raise SpeechError(f"libespeak-ng not found ({exc}); apt-get install espeak-ng") from exc
        self.voice = voice
        self._capture = _Capture()
        self._callback = _SynthCallback(self._capture)  # keep a reference: ctypes must not free it
        with _PROCESS_LOCK:
            rate = self._lib.espeak_Initialize(
                _AUDIO_OUTPUT_SYNCHRONOUS, 0, None, _INIT_PHONEME_EVENTS | _INIT_PHONEME_IPA
            )
            if rate <= 0:
                raise SpeechError("libespeak-ng failed to initialise; check the espeak-ng-data install")
            self.source_rate = int(rate)
            self._select_voice()

    def _select_voice(self) -> None:
        """Make this object's voice current in the shared synthesiser."""
        name = self.voice.encode()
        if self._lib.espeak_SetVoiceByName(name) == 0:
            return
        # Names like "en-gb" are languages, not voice files: look them up by language instead.
        spec = _VoiceSpec(name=None, languages=name, identifier=None, gender=0, age=0, variant=0)
        if self._lib.espeak_SetVoiceByProperties(ctypes.byref(spec)) != 0:
            raise SpeechError(
                f"unknown espeak-ng voice {self.voice!r}; list voices with `espeak-ng --voices`"
            )

    def synthesize(self, text: str) -> Speech:
        """Speak the whole text as one utterance."""
        checked = check_text(text)
        return self._speak(checked)

    def synthesize_sentences(self, text: str) -> Iterator[Speech]:
        """Speak sentence by sentence, yielding each as soon as it is ready."""
        for sentence in split_sentences(check_text(text)):
            yield self._speak(sentence)

    def _speak(self, text: str) -> Speech:
        """Run the synthesiser on one text and build Speech with timings from the phoneme events."""
        data = text.encode("utf-8")
        with _PROCESS_LOCK:
            self._capture.audio.clear()
            self._capture.phones.clear()
            self._select_voice()
            self._lib.espeak_SetSynthCallback(self._callback)
            status = self._lib.espeak_Synth(
                data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8 | _ENDPAUSE, None, None
            )
            self._lib.espeak_Synchronize()
            audio = list(self._capture.audio)
            phones = list(self._capture.phones)
        if status != 0 or not audio:
            raise SpeechError(f"espeak-ng could not speak {text[:40]!r} (status {status}); check the text")
        pcm_src = np.concatenate(audio)
        pcm = resample(to_float32(pcm_src), self.source_rate)
        raw = _phones_to_raw(phones, len(pcm_src))
        timings = to_timings(merge_phones(raw), self.source_rate, len(pcm))
        return Speech(pcm=pcm, phonemes=timings, text=text, source=f"espeak:{self.voice}")


def _phones_to_raw(phones: list[tuple[str, int]], total: int) -> list[RawPhone]:
    """Turn phoneme start samples into durations; audio before the first phoneme is a pause."""
    raw: list[RawPhone] = []
    first = phones[0][1] if phones else total
    if first > 0:
        raw.append(RawPhone(PAUSE, first))
    for i, (name, start) in enumerate(phones):
        end = phones[i + 1][1] if i + 1 < len(phones) else total
        raw.append(RawPhone(name, max(0, min(end, total) - start)))
    return raw

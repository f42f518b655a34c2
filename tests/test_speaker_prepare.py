"""Speech synthesised ahead (issue 47): the sentence the knowledge guard would fall back to, and the persona's
unknown answer, are synthesised while the model writes, and a later `speak` of that text takes them."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from lipstream.audio.speech import Speech
from lipstream.talk.voices.speaker import MAX_PREPARED, Speaker
from lipstream.talk.voices.tts import EspeakTTS


class CountingVoice:
    """espeak-ng, counting what it is asked to say."""

    def __init__(self) -> None:
        self.voice = EspeakTTS()
        self.said: list[str] = []

    def synthesize_sentences(self, text: str) -> Iterator[Speech]:
        self.said.append(text)
        return self.voice.synthesize_sentences(text)


async def _speak(speaker: Speaker, text: str) -> list[Speech]:
    return [s async for s in await speaker.speak(text)]


def test_a_prepared_text_is_synthesised_once_and_spoken_from_there() -> None:
    voice = CountingVoice()
    with ThreadPoolExecutor(1) as pool:
        speaker = Speaker(voices=lambda _name: voice, executor=pool)
        speaker.prepare("The car park has 12 spaces.")
        prepared = asyncio.run(_speak(speaker, "The car park has 12 spaces."))
        assert voice.said == ["The car park has 12 spaces."]
        again = asyncio.run(_speak(speaker, "The car park has 12 spaces."))  # used once: synthesised again
        assert voice.said == ["The car park has 12 spaces."] * 2
    assert [s.text for s in prepared] == [s.text for s in again]
    # the same speech either way (espeak-ng's own length varies by a few samples from run to run)
    assert abs(len(prepared[0].pcm) - len(again[0].pcm)) < 0.01 * len(again[0].pcm)
    assert prepared[0].phonemes and [p.phoneme for p in prepared[0].phonemes] == [
        p.phoneme for p in again[0].phonemes
    ]


def test_a_kept_text_stays_and_others_are_bounded() -> None:
    voice = CountingVoice()
    with ThreadPoolExecutor(1) as pool:
        speaker = Speaker(voices=lambda _name: voice, executor=pool)
        speaker.prepare("I don't have that in my notes.", keep=True)
        for _ in range(3):
            asyncio.run(_speak(speaker, "I don't have that in my notes."))
        assert voice.said == ["I don't have that in my notes."]
        for index in range(MAX_PREPARED + 2):  # never spoken: only the newest few are kept
            speaker.prepare(f"Sentence number {index}.")
        pool.submit(lambda: None).result()
        asyncio.run(_speak(speaker, "Sentence number 0."))  # dropped: synthesised when spoken
        assert voice.said.count("Sentence number 0.") <= 2
        assert voice.said[-1] == "Sentence number 0."


def test_without_an_executor_nothing_is_prepared() -> None:
    voice = CountingVoice()
    speaker = Speaker(voices=lambda _name: voice)
    speaker.prepare("Hello there.")
    assert voice.said == []
    assert [s.text for s in asyncio.run(_speak(speaker, "Hello there."))] == ["Hello there."]

"""Speech kept (issue 47): a sentence every conversation says alike (a persona's unknown answer) is
synthesised once, while the model writes, and every later `speak` of it, in any conversation of the server,
takes it from memory."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

from lipstream.audio.speech import Speech
from lipstream.talk.voices.speaker import MAX_KEPT, KeptSpeech, Speaker
from lipstream.talk.voices.tts import EspeakTTS

UNKNOWN = "I don't have that in my notes."


class CountingVoice:
    """espeak-ng, counting what it is asked to say."""

    def __init__(self) -> None:
        self.voice = EspeakTTS()
        self.said: list[str] = []

    def synthesize_sentences(self, text: str) -> Iterator[Speech]:
        self.said.append(text)
        return self.voice.synthesize_sentences(text)


async def _speak(speaker: Speaker, text: str, quick_start: bool = False) -> list[Speech]:
    return [s async for s in await speaker.speak(text, quick_start=quick_start)]


def test_a_kept_sentence_is_synthesised_once_for_every_conversation() -> None:
    voice = CountingVoice()
    kept: KeptSpeech = {}
    with ThreadPoolExecutor(1) as pool:
        first, second = (Speaker(voices=lambda _name: voice, executor=pool, kept=kept) for _ in range(2))
        first.keep(UNKNOWN)
        said = asyncio.run(_speak(first, UNKNOWN))
        second.keep(UNKNOWN)  # another conversation of the same server: already there
        again = asyncio.run(_speak(second, UNKNOWN, quick_start=True))  # kept whole: never cut
        other = asyncio.run(_speak(second, "The car park has 12 spaces."))  # not kept: synthesised
    assert voice.said == [UNKNOWN, "The car park has 12 spaces."]
    assert [s.text for s in said] == [s.text for s in again] == [UNKNOWN] and again[0].pcm.size > 8000
    assert [s.text for s in other] == ["The car park has 12 spaces."]


def test_the_kept_sentences_are_bounded() -> None:
    voice = CountingVoice()
    with ThreadPoolExecutor(1) as pool:
        speaker = Speaker(voices=lambda _name: voice, executor=pool)
        for index in range(MAX_KEPT + 2):
            speaker.keep(f"Sentence number {index}.")
        pool.submit(lambda: None).result()
        asyncio.run(_speak(speaker, "Sentence number 0."))  # the oldest was let go: synthesised again
        asyncio.run(_speak(speaker, f"Sentence number {MAX_KEPT + 1}."))  # the newest was kept
    assert voice.said.count("Sentence number 0.") == 2
    assert voice.said.count(f"Sentence number {MAX_KEPT + 1}.") == 1


def test_without_an_executor_nothing_is_kept() -> None:
    voice = CountingVoice()
    speaker = Speaker(voices=lambda _name: voice)
    speaker.keep("Hello there.")
    assert voice.said == []
    assert [s.text for s in asyncio.run(_speak(speaker, "Hello there."))] == ["Hello there."]

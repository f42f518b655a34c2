"""The conversation end to end over fake parts (tests/talk_fakes.py, tests/conversation_run.py): the listener
thread, recognition, the turn machine, answers and the session together, with no model, so each test takes
milliseconds. The turn machine's transitions alone: test_turn_machine.py; the answer maker alone:
test_answer_maker.py; the prompts and the states the client sees: test_conversation_prompts.py. The real
Whisper, VAD and models are exercised by test_conversation_turns.py, test_turn_end.py and
test_conversation_live.py."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np
import pytest
from conversation_run import Run, finish, make, question, say
from talk_fakes import (
    CHUNK,
    FailingSTT,
    FixedJudge,
    PlainSTT,
    ScriptedLLM,
    ScriptedSTT,
    ToneVoice,
    YieldingLLM,
    cough,
    silence,
    spoken,
)

from lipstream.talk.conversation_types import STAGES, ConversationConfig, same_words
from lipstream.talk.hearing.transcriber import StreamingTranscript, TimedWord
from lipstream.talk.turn_rule import TurnEndConfig
from lipstream.talk.voices.speaker import Speaker


def test_a_question_is_transcribed_and_answered_once() -> None:
    async def main() -> Run:
        run = make()
        await say(run, question("what time does the library open"))
        await finish(run)
        return run

    run = asyncio.run(main())
    finals = run.kinds("transcript")
    assert [e["text"] for e in finals if e["kind"] == "final"] == ["what time does the library open"]
    assert len(run.session.said) == 1 and run.session.said[0][0].startswith("The library opens")
    assert [m.role for m in run.conversation.history][:1] == ["user"]
    assert run.llm.calls[-1][-1].content.lower().startswith("what time does the library open")


def test_words_are_committed_while_the_user_speaks_and_only_the_tail_is_decoded_at_the_end() -> None:
    question = "what time does the library open today please tell me how far is moon from earth"

    async def main() -> Run:
        run = make()
        await say(run, np.concatenate([silence(0.3), spoken(question), silence(0.8)]))
        await finish(run)
        return run

    run = asyncio.run(main())
    final = [e["text"] for e in run.kinds("transcript") if e["kind"] == "final"]
    assert final == [question]
    partials = [e["text"] for e in run.kinds("transcript") if e["kind"] == "partial"]
    assert partials and all(question.startswith(p) for p in partials)
    # partial decodes read only the undecided tail (primed with the committed text), never the whole turn
    decodes = [c for c in run.stt.calls if c[0] == "words"]
    spoken_seconds = 0.3 * len(question.split())
    assert max(seconds for _, seconds, _ in decodes) < 0.6 * spoken_seconds
    assert any(prompt for _, _, prompt in decodes)
    assert decodes[-1][1] < 2.0  # the final decode: the last moments only
    # the model read the question as it was heard, so its judgement and first token read only the last words
    read = [messages[-1].content for messages in run.llm.prefilled]
    assert read and all(question.startswith(text.lower()) for text in read) and len(set(read)) == len(read)
    assert run.llm.calls[-1][-1].content.lower().startswith(read[-1].lower())


def test_a_recogniser_without_word_timings_decodes_the_whole_turn() -> None:
    async def main() -> Run:
        run = make(stt=PlainSTT())
        await say(run, question("how far is moon from earth"))
        await finish(run)
        return run

    run = asyncio.run(main())
    finals = [e["text"] for e in run.kinds("transcript") if e["kind"] == "final"]
    assert finals == ["how far is moon from earth"]
    assert all(kind == "plain" for kind, _, _ in run.stt.calls)


@pytest.mark.parametrize("streaming", [True, False])
def test_a_silence_starts_the_final_decode_before_the_pause_is_seen(streaming: bool) -> None:
    """The final decode starts at the silence's first window, not when the pause is confirmed: the turn's
    transcript is that decode (none runs at the pause); a silence the user speaks on after costs one decode
    and the transcript still holds every word."""
    # no partial decodes (one started in the silence before the VAD sees it would cover the end as well)
    config = ConversationConfig(start_ms=100, partial_every_seconds=30, pause_ms=320)
    first, rest = "what time does", "the library open"

    async def main() -> tuple[Run, list[float]]:
        run = make(config, stt=None if streaming else PlainSTT())
        update = {"streaming_recognition": streaming}
        run.conversation.config = run.conversation.config.model_copy(update=update)
        vad = run.conversation.listener.vad
        silences: list[float] = []  # how long the silence had lasted when each decode ran
        inner = run.stt
        for name in ("transcribe", "transcribe_words"):
            original = getattr(inner, name)

            def recording(*args, _original=original, **kwargs):
                silences.append(vad.silence_ms)
                return _original(*args, **kwargs)

            setattr(inner, name, recording)
        audio = np.concatenate([silence(0.3), spoken(first), silence(0.2), spoken(rest), silence(0.8)])
        for i in range(0, len(audio), CHUNK):  # 5 ms a chunk: a decode runs before the pause is seen
            await run.conversation.push_microphone(audio[i : i + CHUNK], 16000)
            await asyncio.sleep(0.005)
        await finish(run)
        return run, silences

    run, silences = asyncio.run(main())
    assert [e["text"] for e in run.kinds("transcript") if e["kind"] == "final"] == [f"{first} {rest}"]
    assert 0 < silences[-1] < 320, silences  # the last decode ran in the silence, before the pause
    assert any(0 < s < 200 for s in silences[:-1]), silences  # one at the short silence mid-question
    # a final decode's text is not read ahead: the judgement and the answer read that prompt next
    assert run.llm.prefilled == []


def test_a_partial_decode_ending_in_the_silence_is_shown_but_not_read_ahead() -> None:
    """The final decode runs from the silence's first window: a read-ahead of a partial finishing then would
    run beside it (measured: it slowed the transcript), and the judgement reads that prompt next anyway."""
    config = ConversationConfig(start_ms=100, partial_every_seconds=0.3)

    async def main() -> Run:
        run = make(config)
        vad, decode = run.conversation.listener.vad, run.stt.transcribe_words

        def until_silence(pcm: np.ndarray, prompt: str = ""):  # noqa: ANN202 - a Transcript
            deadline = time.monotonic() + 2  # every partial decode ends once the user has stopped
            while vad.silence_ms == 0 and time.monotonic() < deadline:
                time.sleep(0.002)
            return decode(pcm, prompt)

        run.stt.transcribe_words = until_silence
        audio = question("what time does the library open")
        for i in range(0, len(audio), CHUNK):  # 5 ms a chunk: the decode ends before the pause is seen
            await run.conversation.push_microphone(audio[i : i + CHUNK], 16000)
            await asyncio.sleep(0.005)
        await finish(run)
        return run

    run = asyncio.run(main())
    assert [e for e in run.kinds("transcript") if e["kind"] == "partial"]
    assert run.llm.prefilled == []
    assert len(run.session.said) == 1


def test_a_paused_question_is_answered_once_whole_after_it_ends() -> None:
    config = ConversationConfig(start_ms=100, partial_every_seconds=0.3, end_silence_ms=900)

    async def main() -> Run:
        run = make(config)
        audio = [spoken("what time does the library"), silence(0.6), spoken("open today"), silence(1.2)]
        await say(run, np.concatenate([silence(0.3), *audio]))
        await finish(run)
        return run

    run = asyncio.run(main())
    assert len(run.kinds("user_speech_ended")) == 1
    finals = [e["text"] for e in run.kinds("transcript") if e["kind"] == "final"]
    assert finals == ["what time does the library open today"]
    assert len(run.session.said) == 1  # answered once
    assert run.llm.calls[-1][-1].content.lower().startswith("what time does the library open today")


def test_an_answer_started_at_a_pause_is_kept_when_what_follows_adds_no_words() -> None:
    config = ConversationConfig(start_ms=100, partial_every_seconds=0.3, end_silence_ms=900)

    async def main() -> Run:
        run = make(config)
        audio = [silence(0.3), spoken("how far is moon from earth"), silence(0.4), cough(), silence(1.2)]
        await say(run, np.concatenate(audio))
        await finish(run)
        return run

    run = asyncio.run(main())
    assert len(run.llm.calls) == 1  # the model wrote the answer once
    (metrics,) = run.kinds("turn_metrics")
    assert metrics["speculation"]["used"] == "resumed"
    assert len(run.session.said) == 1


def test_a_detector_judging_the_pause_finished_ends_the_turn_after_its_short_silence() -> None:
    turn = TurnEndConfig(detector="text", finished_ms=200, max_wait_ms=1600)
    config = ConversationConfig(start_ms=100, partial_every_seconds=0.3, turn=turn)
    judge = FixedJudge(0.5)

    async def main() -> Run:
        run = make(config, detector=judge)
        await say(run, np.concatenate([silence(0.3), spoken("tell me a short joke"), silence(0.7)]))
        await finish(run)
        return run

    run = asyncio.run(main())
    ended = run.kinds("user_speech_ended")
    assert len(ended) == 1 and ended[0]["rule"] == "detector"
    assert judge.seen and judge.seen[-1].lower().startswith("tell me a short joke")
    decision = run.kinds("turn_decision")
    assert decision and decision[0]["finished"] is True
    assert run.kinds("turn_metrics")[0]["speculation"]["used"] == "pause"


def test_an_unfinished_judgement_waits_for_the_hard_cap() -> None:
    turn = TurnEndConfig(detector="text", finished_ms=200, max_wait_ms=800)
    config = ConversationConfig(start_ms=100, partial_every_seconds=0.3, turn=turn)

    async def main() -> Run:
        run = make(config, detector=FixedJudge(0.0001))
        await say(run, np.concatenate([silence(0.3), spoken("tell me a short joke"), silence(1.2)]))
        await finish(run)
        return run

    run = asyncio.run(main())
    ended = run.kinds("user_speech_ended")
    assert len(ended) == 1 and ended[0]["rule"] == "max_wait"


async def answer_playing(run: Run) -> None:
    """Ask a question and wait until its answer is in the session, which keeps "playing" it."""
    run.session.hold = asyncio.Event()  # as a real session's is_speaking says while it plays
    await say(run, question("tell me a short joke"))
    for _ in range(100):
        if run.session.said and run.session.said[0]:
            break
        await asyncio.sleep(0.01)


async def speak_over_it(run: Run) -> None:
    """Ask again while the answer plays, past join_seconds (a new question, not a continuation)."""
    await say(run, silence(3.0))
    await say(run, np.concatenate([spoken("how far is moon"), silence(0.8)]))
    await finish(run)


def test_speaking_over_the_answer_interrupts_it_and_the_history_keeps_what_was_heard() -> None:
    async def main() -> Run:
        run = make()
        await answer_playing(run)
        await speak_over_it(run)
        return run

    run = asyncio.run(main())
    assert run.session.interrupts >= 1
    contents = [m.content for m in run.conversation.history]
    assert any(c.endswith(" ...") for c in contents), contents  # what was heard, marked as cut
    assert len(run.kinds("user_speech_started")) == 2


def test_an_answer_whose_last_frame_was_sent_but_not_yet_heard_is_still_cut_by_speech() -> None:
    """`playback_finished` goes out with the answer's last frame, up to the session's lead before it plays:
    speech in that time cuts the answer (reported interrupted, the history keeps what was heard)."""

    async def main() -> Run:
        run = make()
        await answer_playing(run)
        for kind, position in (("speech_started", 0), ("playback_finished", 16000)):  # 1 s ahead of the clock
            event = SimpleNamespace(type=kind, utterance_id=1, position_samples=position, message="",
                                    interrupted=False)  # fmt: skip
            await run.conversation.on_stream_event(event)
        assert not run.kinds("turn_metrics")  # not heard to its end yet: its figures are not final
        await speak_over_it(run)
        return run

    run = asyncio.run(main())
    assert run.session.interrupts >= 1
    first = next(m for m in run.kinds("turn_metrics") if m["turn"] == 1)
    assert first["interrupted"] is True
    contents = [m.content for m in run.conversation.history if m.role == "assistant"]
    assert contents and contents[0].endswith(" ..."), contents  # what was heard, marked as cut


def test_turn_metrics_carry_every_stage_in_order() -> None:
    async def main() -> Run:
        run = make()
        await say(run, question("what time does the library open"))
        await finish(run)  # the first frame: its `speech_started` event, delivered by play()
        return run

    run = asyncio.run(main())
    ms = run.kinds("turn_metrics")[0]["ms"]
    assert list(ms) == list(STAGES)
    assert STAGES[0] == "transcript" and STAGES[-1] == "first_frame" and len(STAGES) == 6
    assert ms["transcript"] is not None and ms["first_phrase"] is not None
    assert ms["llm_first_token"] <= ms["first_phrase"] <= ms["first_audio"] <= ms["first_frame"]


def test_the_model_yields_its_core_while_the_first_phrase_is_synthesised() -> None:
    log: list[str] = []

    class LoggingVoice(ToneVoice):
        def synthesize(self, text: str):  # noqa: ANN202
            log.append(f"voice: {text}")
            return super().synthesize(text)

    async def main() -> Run:
        run = make(llm=YieldingLLM(log, answer="The library opens at nine every day of the week. Bye."))
        run.conversation.answers.speaker = Speaker(voices=lambda _name: LoggingVoice())
        await say(run, question("what time does the library open"))
        await finish(run)
        return run

    run = asyncio.run(main())
    # paused once, for the first phrase only; going on before the next one is synthesised
    assert log[:3] == ["pause", "voice: The library opens", "resume"], log
    assert log.count("pause") == 1 and not run.llm.paused
    assert run.session.said and run.session.said[0][0].startswith("The library opens")


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [("What time is it?", "what time is it", True), ("open", "open today", False), ("", "", False)],
)
def test_same_words_ignores_case_and_punctuation(a: str, b: str, same: bool) -> None:
    assert same_words(a, b) is same


def test_local_agreement_commits_what_two_decodes_agree_on_and_drops_repeats() -> None:
    sr = 16000
    state = StreamingTranscript(turn_start=0, hold_seconds=0.5, whole_turn_seconds=0.0)

    def words(*spec: tuple[str, float, float]) -> list[TimedWord]:
        return [TimedWord(" " + w, int(a * sr), int(b * sr)) for w, a, b in spec]

    first = words(("what", 0.0, 0.3), ("time", 0.3, 0.6), ("does", 0.6, 0.9))
    assert state.update(first, audio_end=int(1.0 * sr)) == "what time does"
    assert not state.committed  # one decode is not agreement
    second = words(("what", 0.0, 0.3), ("time", 0.3, 0.6), ("does", 0.6, 0.9), ("the", 0.9, 1.1))
    state.update(second, audio_end=int(1.2 * sr))
    assert [w.key for w in state.committed] == ["what", "time"]  # "does" ends within the hold
    # a decode from the tail repeats the last committed word: it is not committed twice
    third = words(("time", 0.4, 0.6), ("does", 0.6, 0.9), ("the", 0.9, 1.1), ("library", 1.1, 1.5))
    assert state.update(third, audio_end=int(2.2 * sr)) == "what time does the library"
    assert state.finish(words(("library", 1.1, 1.5), ("open", 1.5, 1.8))) == "what time does the library open"
    assert state.tail_start < int(1.1 * sr)


def test_a_turn_shorter_than_the_commit_length_is_read_whole_each_time() -> None:
    """A question: decodes that agree commit nothing, so the next decode and the final read the whole turn
    (a tail cut after "Can I" read "borrow a bicycle" as "Myroma is equal")."""
    sr = 16000
    state = StreamingTranscript(turn_start=0, hold_seconds=0.5, whole_turn_seconds=12.0)
    said = (("can", 0.0, 0.3), ("I", 0.3, 0.5))
    spoken = [TimedWord(" " + w, int(a * sr), int(b * sr)) for w, a, b in said]
    for end in (1.5, 2.0, 2.5):
        assert state.update(spoken, audio_end=int(end * sr)) == "can I"
    assert not state.committed and state.tail_start == 0 and state.prompt == ""
    state.update(spoken, audio_end=int(12.5 * sr))  # a long turn: agreed words are committed again
    assert [w.key for w in state.committed] == ["can", "i"]


def test_a_failing_model_costs_the_turn_an_apology_and_an_error_event_not_the_session() -> None:
    async def main() -> Run:
        run = make(llm=ScriptedLLM(fail=True))
        await say(run, question("tell me a short joke"))
        await finish(run)
        return run

    run = asyncio.run(main())
    errors = run.kinds("error")
    assert len(errors) == 1 and errors[0]["code"] == "llm" and errors[0]["fatal"] is False
    assert run.session.said == [[ConversationConfig().apology]]
    assert [m.role for m in run.conversation.history] == ["user"]  # the apology is not the model's answer


def test_a_failing_recogniser_costs_the_turn_with_an_error_event_and_the_next_turn_is_heard() -> None:
    stt = FailingSTT()

    async def main() -> Run:
        run = make(stt=stt)
        await say(run, question("tell me a short joke"))
        stt.transcribe_words = ScriptedSTT().transcribe_words  # the endpoint is back
        await say(run, question("how far is moon from earth", after=1.0))
        await finish(run)
        return run

    run = asyncio.run(main())
    errors = run.kinds("error")
    assert errors and errors[0]["code"] == "stt" and errors[0]["fatal"] is False
    finals = [e["text"] for e in run.kinds("transcript") if e["kind"] == "final"]
    assert finals == ["how far is moon from earth"]
    assert len(run.session.said) == 1

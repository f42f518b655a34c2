"""Several answers written at once by the embedded SmolLM2 in one llama.cpp context (issue 49 item 3), in
this process (the server runs it in its model child: tests/test_talk_llm.py)."""

from __future__ import annotations

import threading
import time

import pytest

from lipstream.talk.models.llm import ChatMessage
from lipstream.talk.models.llm_sampling import SamplingConfig

pytestmark = pytest.mark.slow

SYSTEM = ChatMessage("system", "You are a friendly assistant. Answer in one short sentence.")
QUESTIONS = ["Why is the sky blue?", "What do bees eat?", "Where do penguins live?", "How do bees fly?"]
GREEDY = SamplingConfig(temperature=0.0)


@pytest.fixture(scope="module")
def chat():
    from lipstream.talk.models.llm_llama import LlamaChat

    model = LlamaChat(threads=1, slots=4)
    model.warm_up()
    yield model
    model.close()


class Answer:
    """One answer asked of the model: its pieces with their times, its end."""

    def __init__(self, chat, question: str, max_tokens: int = 24, sampling=GREEDY) -> None:
        self.pieces: list[tuple[float, str]] = []
        self.ended = threading.Event()
        self.error: BaseException | None = None
        self.cancel = threading.Event()
        self.asked = time.perf_counter()
        messages = [SYSTEM, ChatMessage("user", question)]
        chat.answer(messages, max_tokens, self.cancel, self._piece, self._end, sampling)

    def _piece(self, text: str) -> None:
        self.pieces.append((time.perf_counter(), text))

    def _end(self, error: BaseException | None) -> None:
        self.error, self.ended_at = error, time.perf_counter()
        self.ended.set()

    @property
    def text(self) -> str:
        return "".join(text for _, text in self.pieces)

    def wait(self) -> str:
        assert self.ended.wait(60), "the answer never ended"
        assert self.error is None, self.error
        return self.text


def test_answers_written_at_once_equal_each_written_alone(chat) -> None:
    alone = [Answer(chat, q).wait() for q in QUESTIONS]
    together = [Answer(chat, q) for q in QUESTIONS]
    assert [a.wait() for a in together] == alone
    assert all(len(text.split()) >= 3 for text in alone), alone


def test_an_answer_asked_while_another_is_written_starts_before_that_one_ends(chat) -> None:
    first = Answer(chat, "Tell me a long story about a dragon.", max_tokens=120)
    while not first.pieces:
        time.sleep(0.005)
    second = Answer(chat, "What is the capital of France?", max_tokens=8)
    second.wait()
    first.wait()
    assert second.pieces[0][0] < first.ended_at  # its first words came while the story was still written
    assert len(first.pieces) > 40


def test_a_fifth_answer_waits_for_a_free_sequence_and_a_cancelled_one_frees_its_own(chat) -> None:
    long = [Answer(chat, f"Tell me a long story about {animal}.", max_tokens=200, sampling=None)
            for animal in ("a dragon", "a cat", "a fox", "an owl")]  # fmt: skip
    fifth = Answer(chat, "What is two plus two?", max_tokens=8)
    time.sleep(0.5)
    assert not fifth.pieces  # all four sequences are writing
    long[0].cancel.set()
    assert fifth.wait()
    for answer in long[1:]:
        answer.cancel.set()
    for answer in long:
        answer.wait()
    assert len(long[0].pieces) < 200


def test_a_prompt_longer_than_a_sequence_is_refused_with_its_size(chat) -> None:
    notes = "The room opens at nine. " * 400
    with pytest.raises(ValueError, match="over the context of 2048"):
        chat.prompt_tokens([SYSTEM, ChatMessage("user", notes)])


def test_an_answer_asked_while_its_read_ahead_still_reads_goes_on_from_what_it_read(chat) -> None:
    """The read-ahead reads the notes and the question as heard so far; the answer's prompt ends otherwise
    (the final transcript, the template's end of message). Asked while the notes are still being read, the
    answer takes the read-ahead's sequence (which ends there) and reads only what it had not."""
    from lipstream.talk.models.llm_schedule import Job

    notes = " ".join(f"Note {i}: the room on floor {i % 4} opens at {8 + i % 3} am." for i in range(30))
    heard = [SYSTEM, ChatMessage("user", f"{notes}\n\nWhen does the room on floor")]
    final = [SYSTEM, ChatMessage("user", f"{notes}\n\nWhen does the room on floor 2 open?")]
    ahead = chat._llama.tokenize(_open(heard).encode(), add_bos=False, special=True)
    read_done = threading.Event()
    reading = Job(ahead, 0, None, print, lambda _e, _r: read_done.set(), threading.Event())
    chat._writer.submit(reading)
    # part of it is read (not a fixed sleep: on a loaded box 1 s had read only 84 tokens)
    assert _wait(lambda: reading.read > 100)
    assert not read_done.is_set()
    prompt = chat.prompt_tokens(final)
    seated: list[Job] = []
    answer = Job(prompt, 4, GREEDY, lambda _t: None, lambda _e, _r: seated.append(answer), threading.Event())
    chat._writer.submit(answer)
    assert read_done.wait(10) and _wait(lambda: bool(seated))
    assert answer.cached > 100  # what the read-ahead had read, not the system prompt alone
    assert answer.cached <= len(prompt) - 1


def test_another_conversations_answer_leaves_a_read_ahead_just_begun_to_read_on(chat) -> None:
    """An answer that shares only the system prompt with a read-ahead (another conversation's notes) does not
    take its sequence, however little of it was read yet: the notes are read to the end beside the answer."""
    from lipstream.talk.models.llm_schedule import Job

    # a system prompt no other test used: no free sequence holds it, so only the read-ahead's shares it
    system = ChatMessage("system", "You are the desk of the Hillside rooms. Answer briefly.")
    notes = " ".join(f"Note {i}: the room on floor {i % 4} opens at {8 + i % 3} am." for i in range(20))
    ahead = chat._llama.tokenize(_open([system, ChatMessage("user", notes)]).encode(), add_bos=False,
                                 special=True)  # fmt: skip
    ends: list[int] = []
    reading = Job(ahead, 0, None, print, lambda _e, read: ends.append(read), threading.Event())
    chat._writer.submit(reading)
    assert _wait(lambda: reading.read > 0)  # begun: what it has read is (about) the system prompt alone
    answered = threading.Event()
    prompt = chat.prompt_tokens([system, ChatMessage("user", QUESTIONS[1])])
    answer = Job(prompt, 4, GREEDY, lambda _t: None, lambda _e, _r: answered.set(), threading.Event())
    chat._writer.submit(answer)
    assert answered.wait(30)
    assert _wait(lambda: bool(ends)) and ends == [len(ahead)]  # read to its end, not cut short


def test_an_answer_seated_beside_a_sequence_holding_its_start_copies_it_and_writes_the_same(chat) -> None:
    """A knowledge turn's instructions are in the sequence of a read-ahead still reading other notes: the
    answer, seated in another sequence, copies them from there instead of reading them again, and writes
    what it writes when read from nothing (greedy: the same words)."""
    from lipstream.talk.models.llm_schedule import Job

    system = ChatMessage("system", "You are the desk of the Old Mill museum. " + "Answer kindly. " * 12)
    question = [system, ChatMessage("user", "Where is the museum?")]
    prompt = chat.prompt_tokens(question)
    _forget(chat)
    expected = _written(chat, prompt)  # read from nothing
    _forget(chat)
    notes = " ".join(f"Room {i} of the mill shows the {i}th century." for i in range(40))
    ahead = chat._llama.tokenize(_open([system, ChatMessage("user", notes)]).encode(), add_bos=False,
                                 special=True)  # fmt: skip
    reading = Job(ahead, 0, None, print, lambda _e, _r: None, threading.Event())
    chat._writer.submit(reading)
    system_tokens = len(chat.prompt_tokens([system, ChatMessage("user", "")])) - 8
    assert _wait(lambda: reading.read > system_tokens + 20)
    texts: list[str] = []
    done = threading.Event()
    answer = Job(prompt, 12, GREEDY, texts.append, lambda _e, _r: done.set(), threading.Event())
    chat._writer.submit(answer)
    assert done.wait(30)
    assert answer.slot != reading.slot and answer.cached >= system_tokens  # copied, not read again
    assert "".join(texts) == expected


def _written(chat, prompt: list[int]) -> str:
    """A greedy 12-token answer to `prompt` (tokens), its text."""
    from lipstream.talk.models.llm_schedule import Job

    texts: list[str] = []
    done = threading.Event()
    chat._writer.submit(Job(prompt, 12, GREEDY, texts.append, lambda _e, _r: done.set(), threading.Event()))
    assert done.wait(30)
    return "".join(texts)


def _forget(chat) -> None:
    """Empty every sequence of the answers' context (the writer idle: no job holds one)."""
    writer = chat._writer
    assert _wait(lambda: not writer._jobs and not writer._waiting)
    for slot in range(len(writer._cached)):
        writer._lib.llama_memory_seq_rm(writer._memory, slot, -1, -1)
        writer._cached[slot] = []


def _open(messages: list[ChatMessage]) -> str:
    from lipstream.talk.models.llm_llama import _chatml

    *context, last = messages
    return _chatml(context, last.role, last.content)


def _wait(done, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while not done() and time.monotonic() < deadline:
        time.sleep(0.01)
    return done()

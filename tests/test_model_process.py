"""Issue 19: the supervisor of native model processes: restarts with backoff, gives up, leaves no orphan.

The children here are real processes: small Python programs that behave like a model child (a ready line,
then serve or die) for the supervisor's own rules, and the real embedded language model for the orphan and
the command-line checks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from lipstream.talk.models.model_process import (
    ChildCommand,
    ProcessState,
    RestartPolicy,
    SupervisedProcess,
    describe_exit,
)

REPO = Path(__file__).resolve().parent.parent
FAST = RestartPolicy(max_failed_starts=3, first_backoff_seconds=0.01, ready_timeout_seconds=20)
# a child that is ready at once and then idles (it holds no port: the supervisor only reads the line)
READY_CHILD = "import json, time; print(json.dumps({'ready': True, 'port': 1}), flush=True); time.sleep(600)"


def python_child(code: str) -> ChildCommand:
    """`python -c CODE` (the supervisor's --parent-pid lands in sys.argv, unused)."""
    return ChildCommand([sys.executable, "-c", code], "test child")


def process_state(pid: int) -> str:
    """`pid`'s state letter from /proc (R running, S sleeping, T stopped, Z zombie); OSError when gone."""
    return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as gone)."""
    try:
        return process_state(pid) != "Z"
    except OSError:
        return False


def test_describe_exit_names_the_signal_or_the_last_error_line() -> None:
    assert describe_exit(-signal.SIGSEGV) == "killed by SIGSEGV"
    assert describe_exit(2, ["loading", "error: no model", ""]) == "exit code 2: error: no model"
    assert describe_exit(None) == "still running"


def test_a_child_that_never_gets_ready_is_given_up_after_the_policy() -> None:
    supervisor = SupervisedProcess(
        python_child("import sys; print('error: cannot load weights', file=sys.stderr); sys.exit(3)"), FAST
    )
    started = time.monotonic()
    supervisor.start()
    try:
        assert supervisor.wait_ready(30) is None
        status = supervisor.status()
        assert status.state is ProcessState.FAILED
        assert status.restarts == FAST.max_failed_starts - 1
        assert status.last_exit == "exit code 3: error: cannot load weights"
        assert time.monotonic() - started < 15
    finally:
        supervisor.stop()


def test_a_crashed_child_is_restarted_and_counted() -> None:
    supervisor = SupervisedProcess(python_child(READY_CHILD), FAST)
    supervisor.start()
    try:
        first = supervisor.wait_ready(20)
        assert first is not None and supervisor.status().state is ProcessState.UP
        os.kill(first.pid, signal.SIGSEGV)
        assert supervisor.has_exited(first, wait_seconds=5)
        deadline = time.monotonic() + 10
        second = None
        while time.monotonic() < deadline:
            second = supervisor.wait_ready(1)
            if second is not None and second.generation > first.generation:
                break
        assert second is not None and second.pid != first.pid and second.key != first.key
        status = supervisor.status()
        assert status.restarts == 1 and status.last_exit == "killed by SIGSEGV" and status.pid == second.pid
    finally:
        supervisor.stop()
    assert not alive(second.pid) and supervisor.status().state is ProcessState.STOPPED


def test_stop_ends_a_child_that_ignores_sigterm() -> None:
    code = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + READY_CHILD
    policy = RestartPolicy(stop_grace_seconds=0.5)
    supervisor = SupervisedProcess(python_child(code), policy)
    supervisor.start()
    endpoint = supervisor.wait_ready(20)
    assert endpoint is not None
    supervisor.stop()
    assert not alive(endpoint.pid)


@pytest.mark.slow
def test_the_model_child_dies_with_its_parent_even_on_sigkill() -> None:
    """A parent killed with SIGKILL runs no cleanup: the child must go by itself (parent-death signal)."""
    parent_code = textwrap.dedent(
        """
        import time
        from lipstream.talk.models.llm_embedded import EmbeddedChatModel
        model = EmbeddedChatModel()
        model.warm_up()
        print(model.status().pid, flush=True)
        time.sleep(600)
        """
    )
    argv = [sys.executable, "-c", parent_code]
    parent = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(parent.stdout.readline())  # type: ignore[union-attr]
        cmdline = Path(f"/proc/{child_pid}/cmdline").read_bytes().split(b"\0")
        # an operator sees the model in `ps`, never the key
        assert b"lipstream.talk.models.llm_child" in cmdline and any(b"SmolLM2" in part for part in cmdline)
        assert not any(b"KEY" in part for part in cmdline)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 5
        while alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(child_pid), "the model process outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.fixture(scope="module")
def broken_model(tmp_path_factory: pytest.TempPathFactory):
    """An embedded model over a file that is not a GGUF: its process fails at each start (one model, shared by
    the tests that need a model that cannot come up)."""
    import asyncio

    from lipstream.talk.models.llm_embedded import EmbeddedChatModel

    broken = tmp_path_factory.mktemp("broken") / "broken.gguf"
    broken.write_bytes(b"this is not a model" * 100)
    model = EmbeddedChatModel(broken, restart=RestartPolicy(max_failed_starts=2, first_backoff_seconds=0.01))
    yield model
    asyncio.run(model.aclose())


def test_a_model_that_cannot_start_makes_every_turn_say_unavailable_at_once(broken_model) -> None:
    """A file that is not a GGUF: each start fails; after the policy's starts warm_up names the reason and
    each turn fails at once with "language model unavailable" (the conversation's apology path)."""
    import asyncio

    from lipstream.errors import ModelError
    from lipstream.talk.models.llm import ChatMessage, LLMError

    with pytest.raises(ModelError, match="could not start: exit code 2"):
        broken_model.warm_up()
    assert broken_model.status().state is ProcessState.FAILED

    async def ask() -> None:
        async for _ in broken_model.stream([ChatMessage("user", "Hello?")]):
            pass

    started = time.monotonic()
    with pytest.raises(LLMError, match="language model unavailable"):
        asyncio.run(ask())
    assert time.monotonic() - started < 1.0  # no waiting on a model that will not come


def test_clients_of_the_model_child_share_one_tls_context(
    broken_model, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each turn opens clients to the child (the judgement, the answer, each read-ahead): none may build a TLS
    context of its own (httpx loads the CA bundle for each: 20-70 ms on the event loop, in the turn's
    critical path)."""
    import asyncio
    import ssl

    built: list[object] = []
    real = ssl.create_default_context
    monkeypatch.setattr(ssl, "create_default_context", lambda *a, **k: built.append(1) or real(*a, **k))
    clients = [broken_model._client() for _ in range(3)]
    assert built == []
    for client in clients:
        asyncio.run(client.aclose())


def _becomes_stopped(pid: int, stopped: bool = True, wait_seconds: float = 1.0) -> bool:
    """Whether `pid` is (or within `wait_seconds` becomes) stopped, state T, or running when not `stopped`:
    a signal just sent takes a moment to take effect."""
    deadline = time.monotonic() + wait_seconds
    while True:
        if (process_state(pid) == "T") == stopped:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)


@pytest.mark.slow
def test_the_model_yields_its_core_only_while_it_serves_one_answer() -> None:
    """Issue 35: while an answer's first phrase is synthesised the model process is stopped, and goes on by
    `resume` or by the pause's own timer. Issue 49: only while it serves that one answer: another
    conversation's answer asked meanwhile resumes it at once and is written whole, and a pause asked while
    two answers are in flight does nothing."""
    import asyncio

    from lipstream.talk.models.llm import ChatMessage, YieldsCores
    from lipstream.talk.models.llm_embedded import EmbeddedChatModel

    async def scenario(model: EmbeddedChatModel) -> None:
        pid = model.status().pid
        assert isinstance(model, YieldsCores) and pid is not None
        messages = [ChatMessage("user", "Say hello.")]
        model.pause(5.0)
        assert _becomes_stopped(pid)
        reply = asyncio.create_task(_first_token(model, messages))  # another conversation's answer
        await asyncio.sleep(0.05)  # the answer is asked for (on this loop), which resumes the child
        assert _becomes_stopped(pid, stopped=False, wait_seconds=2.0)
        token, _at = await asyncio.wait_for(reply, 20)
        assert token
        model.pause(0.3)  # not resumed by hand: its timer lets it go on
        assert _becomes_stopped(pid)
        await asyncio.sleep(0.6)
        assert _becomes_stopped(pid, stopped=False)
        long_answer = [ChatMessage("user", "Tell me a long story about a lighthouse keeper.")]
        first = model.stream(long_answer, 200)
        second = model.stream(long_answer, 200)
        assert await anext(first) and await anext(second)  # two answers in flight
        model.pause(5.0)
        await asyncio.sleep(0.3)
        assert process_state(pid) != "T"  # the other answer needs the model more than a voice does
        await first.aclose()
        await second.aclose()
        text = "".join([delta async for delta in model.stream(messages, 8)])
        assert text.strip()

    model = EmbeddedChatModel()
    try:
        model.warm_up()
        asyncio.run(scenario(model))
    finally:
        asyncio.run(model.aclose())


async def _first_token(model, messages) -> tuple[str, float]:  # noqa: ANN001
    async for delta in model.stream(messages, 8):
        return delta, time.perf_counter()
    return "", time.perf_counter()

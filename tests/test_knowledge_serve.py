"""`serve --agent --knowledge PATH --persona FILE`: the flags checked at start, /healthz naming the persona
and the index, a conversation per session given its own grounding, and `doctor --knowledge`."""

from __future__ import annotations

from pathlib import Path

import pytest

from lipstream.cli import build_parser, main
from lipstream.commands.doctor import doctor
from lipstream.commands.doctor_checks import knowledge_check, persona_check
from lipstream.errors import LipstreamError
from lipstream.server.cli import _agent_config
from lipstream.talk.agent import AgentConfig, AgentServices
from lipstream.talk.knowledge.grounding import KnowledgeGrounding
from lipstream.talk.knowledge.index import KnowledgeBase
from lipstream.talk.knowledge.persona import PersonaError

PERSONA = """name = "Ada"
greeting = "Hello, I am Ada."
instructions = "You help library visitors."
voice = "espeak"
"""


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "hours.md").write_text("# Hours\nThe library opens at 9 am on weekdays.\n")
    (folder / "wifi.txt").write_text("The wifi password is bluefern42.\n")
    return folder


@pytest.fixture
def persona_file(tmp_path: Path) -> Path:
    path = tmp_path / "ada.toml"
    path.write_text(PERSONA)
    return path


def _args(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def test_flags_make_the_agent_config(notes: Path, persona_file: Path) -> None:
    config = _agent_config(_args("--agent", "--knowledge", str(notes), "--persona", str(persona_file)))
    assert config.knowledge == notes.resolve()
    assert config.persona is not None and config.persona.name == "Ada" and config.persona.voice == "espeak"


def test_bad_flags_are_refused_at_start(notes: Path, persona_file: Path, tmp_path: Path, capsys) -> None:
    assert main(["serve", "--knowledge", str(notes)]) == 2
    assert "--knowledge and --persona are for a conversation: add --agent" in capsys.readouterr().err
    with pytest.raises(
        LipstreamError, match="--system-prompt and --persona both give the instructions; use one"
    ):
        _agent_config(_args("--agent", "--persona", str(persona_file), "--system-prompt", "Be brief."))
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "Ada"\nvoice = "galadriel"\n')
    with pytest.raises(PersonaError, match=f"{bad}: voice: unknown voice 'galadriel'"):
        _agent_config(_args("--agent", "--persona", str(bad)))


def test_services_give_each_conversation_its_grounding_and_healthz_the_persona(
    notes: Path, persona_file: Path
) -> None:
    from starlette.testclient import TestClient

    from lipstream.server.app import create_app
    from lipstream.server.config import ServerConfig

    config = _agent_config(_args("--agent", "--knowledge", str(notes), "--persona", str(persona_file)))
    # the knowledge and persona parts of the services (no speech or language model is loaded for them)
    services = AgentServices(
        config=config, stt=None, llm=None, vad_model=None, knowledge=KnowledgeBase(notes)
    )
    assert services.greeting == "Hello, I am Ada." and services.voice == "espeak"
    first, second = services._grounding()["grounding"], services._grounding()["grounding"]
    assert isinstance(first, KnowledgeGrounding) and first is not second  # its own prefetch per conversation
    assert first.knowledge is second.knowledge  # one index for the server
    assert first.config.unknown_answer == config.persona.unknown_answer
    with TestClient(create_app(ServerConfig(), engine=None, agent=services)) as client:
        body = client.get("/healthz").json()
    assert body["persona"] == {"name": "Ada", "greeting": "Hello, I am Ada."}
    assert body["knowledge"]["documents"] == 2 and body["knowledge"]["chunks"] == 2
    plain = AgentServices(config=AgentConfig(), stt=None, llm=None, vad_model=None)
    assert plain._grounding() == {} and plain.knowledge_status() is None and plain.greeting is None


def test_doctor_reports_the_index(notes: Path, persona_file: Path, tmp_path: Path) -> None:
    check = knowledge_check(notes)
    first = check.run()
    assert first.startswith("2 documents, 2 chunks, just built (")
    assert "2 documents, 2 chunks, built 0 s ago" in check.run()
    assert persona_check(persona_file).run().startswith("Ada (espeak voice, English;")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(Exception, match="holds no documents"):
        knowledge_check(empty).run()
    assert doctor(checks=[knowledge_check(empty)]) == 1  # a failed line with its fix, not a crash
    args = build_parser().parse_args(["doctor", "--knowledge", str(notes), "--persona", str(persona_file)])
    assert (args.knowledge, args.persona) == (notes, persona_file)

"""A persona: who the avatar is (name, greeting, instructions, voice, language), loaded from a TOML file.

```toml
name = "Ada"
greeting = "Hello, I am Ada, the library's assistant. What would you like to know?"
instructions = "You answer questions about the Riverside Library, kindly and in one or two short sentences."
voice = "piper"
language = "en"
unknown_answer = "I don't have that in my notes."
wait_line = "One moment, please: I am with another reader."
```
"""

from __future__ import annotations

import os
from pathlib import Path

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from lipstream.errors import LipstreamError
from lipstream.talk.conversation_types import ConversationConfig
from lipstream.talk.voices.tts import VOICES

LANGUAGES = {"en": "English", "fr": "French", "de": "German", "es": "Spanish", "it": "Italian",
             "pt": "Portuguese", "nl": "Dutch"}  # fmt: skip
DEFAULT_UNKNOWN_ANSWER = "I don't have that in my notes."


class PersonaError(LipstreamError):
    """A persona file that cannot be used: missing, not TOML, an unknown key or voice, a bad value."""


class Persona(BaseModel):
    """Who the avatar is; `apply()` turns it into a conversation's system prompt and voice."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=60)
    greeting: str | None = Field(None, max_length=400)  # spoken when a Talk session starts
    instructions: str = Field(
        "You are a friendly assistant who answers out loud in one to three short spoken sentences, in plain "
        "words: no lists, no markdown, no emoji.", min_length=1, max_length=4000,
    )  # fmt: skip
    voice: str = "piper"
    language: str = "en"
    unknown_answer: str = Field(DEFAULT_UNKNOWN_ANSWER, min_length=1, max_length=300)  # when notes do not say
    wait_line: str | None = Field(None, min_length=1, max_length=300)  # when every seat is taken (seats.py)

    @field_validator("voice")
    @classmethod
    def _known_voice(cls, value: str) -> str:
        if value not in VOICES:
            raise ValueError(f"unknown voice {value!r}; choose one of {', '.join(VOICES)}")
        return value

    @field_validator("language")
    @classmethod
    def _known_language(cls, value: str) -> str:
        if value not in LANGUAGES:
            raise ValueError(f"unknown language {value!r}; choose one of {', '.join(LANGUAGES)}")
        return value

    @classmethod
    def load(cls, path: str | os.PathLike) -> Persona:
        """Read a persona TOML file (PersonaError naming the file and what is wrong)."""
        file = Path(path).expanduser()
        try:
            data = tomllib.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise PersonaError(f"--persona {file}: no such file; give a TOML file with name, greeting, "
                               "instructions, voice and language") from None  # fmt: skip
        except (OSError, UnicodeDecodeError) as exc:
            raise PersonaError(f"cannot read the persona file {file}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise PersonaError(f"the persona file {file} is not valid TOML: {exc}") from None
        try:
            return cls(**data)
        except ValidationError as exc:
            first = exc.errors()[0]
            key = ".".join(str(part) for part in first["loc"]) or "(file)"
            if first["type"] == "extra_forbidden":
                allowed = ", ".join(cls.model_fields)
                raise PersonaError(f"the persona file {file} has an unknown key {key!r}; the keys are "
                                   f"{allowed}") from None  # fmt: skip
            message = first["msg"].removeprefix("Value error, ")
            raise PersonaError(f"the persona file {file}: {key}: {message}") from None

    @property
    def language_name(self) -> str:
        """The language's English name ("English")."""
        return LANGUAGES[self.language]

    def system_prompt(self) -> str:
        """The persona's instructions as a system prompt: who it is first, then how to answer."""
        return (f"Your name is {self.name}. {self.instructions.strip()} "
                f"Always reply in {self.language_name}, "
                "in one to three short spoken sentences.")  # fmt: skip

    def apply(self, config: ConversationConfig) -> ConversationConfig:
        """`config` with this persona's system prompt and voice (a new config; `config` is unchanged)."""
        update: dict[str, object] = {"system_prompt": self.system_prompt(), "voice": self.voice}
        if self.wait_line:
            update["wait_line"] = self.wait_line
        return config.model_copy(update=update)

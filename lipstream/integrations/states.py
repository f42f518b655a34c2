"""The agent state a framework adapter reports, in the protocol's names (docs/protocol.md, `state`).

An adapter only knows whether its face is speaking, so it reports `listening` and `speaking`: `thinking`
and the user's states come from a turn machine, and in Pipecat and LiveKit that is the framework's own.
Imports no framework, so the Pipecat processor and the LiveKit generator share it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

log = logging.getLogger(__name__)

AgentState = Literal["listening", "speaking"]
StateCallback = Callable[[AgentState], None]


class AgentStateView:
    """Whether the face speaks, as `listening`/`speaking`, calling `on_state` once per change."""

    def __init__(self, on_state: StateCallback | None = None) -> None:
        """`on_state(agent)`: called on the adapter's event loop at each change, never twice alike."""
        self._on_state = on_state
        self._agent: AgentState = "listening"

    @property
    def agent(self) -> AgentState:
        """`speaking` while the face's speech plays, else `listening`."""
        return self._agent

    def set(self, speaking: bool) -> None:
        """The face speaks (True) or not (False) from now on."""
        agent: AgentState = "speaking" if speaking else "listening"
        if agent == self._agent:
            return
        self._agent = agent
        if self._on_state is None:
            return
        try:
            self._on_state(agent)
        except Exception:  # noqa: BLE001 - it runs inside the frame loop: a failing callback must not stop it
            log.exception("on_state callback failed")

"""lipstream in LiveKit Agents (see docs/integrations.md, "Use it from LiveKit").

- `LipstreamVideoGenerator("anchor")`: livekit-agents' `VideoGenerator` over a lipstream Session, for an
  `AvatarRunner` in the avatar worker;
- `AvatarSession(...).start(agent_session, room)`: the agent side, used like a hosted avatar plugin;
- `lipstream livekit-worker`: the worker a user runs (`dispatch.AvatarDispatcher` serving /launch,
  `room.run_avatar_in_room` per room).

Needs `pip install 'lipstream[livekit]'` (livekit-agents 1.8.9, livekit 1.1.21).
"""

from lipstream.integrations.livekit.agent import AvatarSession
from lipstream.integrations.livekit.generator import LipstreamVideoGenerator

__all__ = ["AvatarSession", "LipstreamVideoGenerator"]

"""The conversation benchmark's helpers under their former name, for knowledge_desk_bench.py, which imports
them by bare name (the script itself is benchmarks/scenarios/conversation.py)."""

from benchmarks.scenarios.conversation_figures import aggregate, percentiles, plot, summarise  # noqa: F401
from benchmarks.scenarios.conversation_questions import (  # noqa: F401
    HELDOUT_QUESTIONS,
    HELDOUT_VOICES,
    STAGES,
    _write_wav,
    espeak_wav,
    wer,
)
from benchmarks.scenarios.conversation_servers import start_agent_server, stop  # noqa: F401

"""Adapters that put a lipstream avatar into other frameworks' pipelines (see docs/integrations.md).

Each adapter lives in its own module and imports its framework there, so `import lipstream` never needs
one: `from lipstream.integrations.pipecat import LipstreamAvatar` (needs `lipstream[pipecat]`).
"""

"""Engines: the Engine interface and one module per engine (viseme, musetalk)."""

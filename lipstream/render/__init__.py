"""Rendering: planner, infill, compositor, offline render and the streaming Session."""

"""The command layer: CLI commands that combine rooms (avatar + engines + render), so the rooms below keep
their one-way arrows (avatar/ never imports render/ or engines/)."""

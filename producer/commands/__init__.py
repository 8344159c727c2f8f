"""CLI commands, grouped by what they need: local ones use sandbox_core only."""

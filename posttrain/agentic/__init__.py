"""Agentic RL (SPEC §C6–C7): gateway, trace store, harness × task, session credit."""

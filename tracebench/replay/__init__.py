"""Replay: trace -> engine -> router + policy -> client -> records (docs/run-format.md)."""

"""`tracebench report`: read run folders (docs/run-format.md) and compare them. Never imports the replay path."""

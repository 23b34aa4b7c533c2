"""tracebench: record-and-replay benchmarking for LLM serving on sglang."""

__version__ = "0.1.0"

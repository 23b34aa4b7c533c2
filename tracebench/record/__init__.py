"""`tracebench record`: a proxy that turns live sglang traffic into a trace (docs/record.md)."""

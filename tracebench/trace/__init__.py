"""Traces: the format (format.py), how they are made (generate.py, datasets.py) and summarised (inspect.py)."""

"""The numeric option types of every command. click's FLOAT accepts `nan` and `inf` (a `--speed inf` simulator never
answers), and its INT any integer however large (`--seed 10**26` overflowed when the header was written). Every
number option of every command uses these instead (tests/test_edges.py checks it): a value that is not a finite
number, or not an integer within the option's bounds, is one line naming the option, exit 2 (ConfigError). The
meaning of a value (> 0, a port, ...) is still checked where it is used, so that the library refuses it too.
Light at import time: `tracebench --help` imports every commands module, and these with them."""

from __future__ import annotations

import math
import os

import click

from tracebench.errors import ConfigError

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1  # what orjson, numpy and Parquet hold
SEED_RANGE = "an integer from 0 to 2^63-1"
# --speed K of the simulator and the replay: beyond these a run is nonsense (at 1e-300 nothing is ever answered, at
# 1e300 every time of the trace is 0 and every timeout expires at once)
SPEED_RANGE = (1e-3, 1e6)


def _flag(param: click.Parameter | None) -> str:
    if param is None:
        return "the value"
    return max(param.opts, key=len) if isinstance(param, click.Option) else param.human_readable_name


class FiniteFloat(click.ParamType):
    """A float that is a finite number: nan, inf and -inf are refused."""

    name = "float"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        else:
            try:
                number = float(str(value))
            except ValueError:
                raise ConfigError(f"{_flag(param)} must be a number, got {value!r}") from None
        if not math.isfinite(number):
            raise ConfigError(f"{_flag(param)} must be a finite number, got {value}")
        return number


class BoundedInt(click.ParamType):
    """An integer within [low, high] (by default the 64-bit range every writer holds)."""

    name = "integer"

    def __init__(self, low: int = INT64_MIN, high: int = INT64_MAX, described: str | None = None) -> None:
        self.low, self.high = low, high
        self.described = described or ("a 64-bit integer (-2^63 to 2^63-1)" if (low, high) == (INT64_MIN, INT64_MAX)
                                       else f"an integer from {low} to {high}")

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            text = str(value).strip()
            try:
                number = int(text)
            except ValueError:
                raise ConfigError(f"{_flag(param)} must be {self.described}, got {value!r}") from None
        if not self.low <= number <= self.high:
            raise ConfigError(f"{_flag(param)} must be {self.described}, got {number}")
        return number


FINITE = FiniteFloat()
INT = BoundedInt()
SEED = BoundedInt(0, INT64_MAX, SEED_RANGE)


# requests.jsonl's columnar copy (report/columns.py) is written from this size on: ~50,000 records; a JSONL below
# parses in < 0.15 CPU-s
COPY_MIN_BYTES = 32 << 20
# for tests only: another threshold in bytes, so that a small run gets its copy too (docs/run-format.md)
COPY_MIN_BYTES_ENV = "TRACEBENCH_COPY_MIN_BYTES"


def copy_min_bytes() -> int:
    """The size from which requests.jsonl gets a copy: COPY_MIN_BYTES, or the test's TRACEBENCH_COPY_MIN_BYTES. replay
    and sweep call it before their run, so a bad value stops them before anything runs."""
    value = os.environ.get(COPY_MIN_BYTES_ENV)
    if value is None:
        return COPY_MIN_BYTES
    if not (value.isascii() and value.isdigit()):
        raise ConfigError(f"environment variable {COPY_MIN_BYTES_ENV}={value!r}: expected a number of bytes >= 0")
    return int(value)

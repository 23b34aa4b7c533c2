"""Inter-token latency (ITL) as requests.jsonl stores it: per request, a sparse histogram of its inter-chunk gaps.

A streamed answer arrives as chunks; the gaps between successive chunks after the first token are its ITL values
(as vllm's bench reports them: every gap of every request pooled). Storing each gap would add ~128 numbers to every
record; instead each gap is put in a log bucket 2% wide (any gap reconstructed within 1%), and a record keeps the
buckets it used with how many gaps fell in each, as one string `itl_hist` = "b:n,b:n,..." (ascending b; a string
because polars reads a string column ~3x faster than JSON lists, and parses it only for the ITL rows), plus its
largest gap exactly (`itl_max`). Bucket 0 holds gaps under 10 µs (two chunks read at once); bucket b >= 1 holds
[FLOOR * GROWTH^(b-1), FLOOR * GROWTH^b). docs/run-format.md says the same. Light: imported by the replay and the
report alike.
"""

from __future__ import annotations

import functools
import math

FLOOR_S = 1e-5
MEMO_SIZE = 4096  # gaps an ItlGaps.add memo remembers with their bucket
GROWTH = 1.02
LOG_GROWTH = math.log(GROWTH)


def bucket_of(gap_s: float) -> int:
    if gap_s < FLOOR_S:
        return 0
    return 1 + int(math.log(gap_s / FLOOR_S) / LOG_GROWTH)


@functools.lru_cache(maxsize=1024)
def sure_range(bucket: int) -> tuple[float, float]:
    """(lo, hi): every gap with lo < gap < hi is in `bucket` by `bucket_of`, with no need to compute its log: a
    bucket's range narrowed by a billionth of itself, far more than the few ulps `bucket_of`'s arithmetic can err by
    (the gaps of a decode run are alike: most fall in the bucket of the one before)."""
    if bucket == 0:
        return -math.inf, FLOOR_S   # bucket_of compares with FLOOR_S exactly
    return FLOOR_S * GROWTH ** (bucket - 1) * (1.0 + 1e-9), FLOOR_S * GROWTH ** bucket * (1.0 - 1e-9)


def bucket_value(bucket: int) -> float:
    """The gap a bucket stands for: 0 for bucket 0, else the geometric middle of its range (seconds)."""
    if bucket == 0:
        return 0.0
    return FLOOR_S * GROWTH ** (bucket - 1) * math.sqrt(GROWTH)


class ItlGaps:
    """One request's inter-chunk gaps, as they arrive."""

    __slots__ = ("counts", "largest")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.largest = -math.inf   # the largest gap so far (any gap is larger than none)

    def add(self, gap_s: float, memo: dict[float, int] | None = None) -> None:
        """One gap. `memo` (gap -> bucket, shared by many requests' ItlGaps): the requests of one decode step see the
        same gap, so its bucket is computed once (bounded: cleared past MEMO_SIZE gaps)."""
        if memo is None:
            bucket = bucket_of(gap_s)
        else:
            bucket = memo.get(gap_s)  # type: ignore[assignment]
            if bucket is None:
                if len(memo) > MEMO_SIZE:
                    memo.clear()
                bucket = memo[gap_s] = bucket_of(gap_s)
        counts = self.counts
        counts[bucket] = counts.get(bucket, 0) + 1
        if gap_s > self.largest:
            self.largest = gap_s

    def merge(self, counts: dict[int, int], largest: float) -> None:
        """Add gaps already bucketed (`counts`, the largest of them `largest`), as if each were add()ed."""
        mine = self.counts
        for bucket, count in counts.items():
            mine[bucket] = mine.get(bucket, 0) + count
        if counts and largest > self.largest:
            self.largest = largest

    def fields(self) -> tuple[float | None, str | None]:
        """(itl_max, itl_hist) for the record; both None when there was no gap (one chunk)."""
        if not self.counts:
            return None, None
        return self.largest, ",".join([f"{b}:{n}" for b, n in sorted(self.counts.items())])


HIST_PATTERN = r"^[0-9]+:[0-9]+(,[0-9]+:[0-9]+)*$"  # what an itl_hist string looks like (the report checks it)


def parse_hist(text: str) -> list[tuple[int, int]]:
    """"b:n,b:n" -> [(b, n), ...]."""
    return [(int(b), int(n)) for b, n in (pair.split(":") for pair in text.split(","))]

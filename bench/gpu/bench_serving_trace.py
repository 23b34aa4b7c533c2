"""A tracebench trace with the exact arrival times sglang 0.5.17's `bench_serving` draws for a random-ids run.

    python bench/gpu/bench_serving_trace.py -o traces/bs.jsonl [--rate 8 --num-prompts 400 --input-len 512
                                            --output-len 128 --vocab-size 32000 --seed 42]

Why: at a rate the server can keep up with, throughput is set by the arrivals, so two tools drawing different
Poisson sequences at the same rate report different throughput (tracebench's seed-0 trace: 400 requests in 47.1 s;
bench_serving's seed-42 draw: in 49.8 s). Replaying bench_serving's own sequence compares the tools, not the draws.

How bench_serving draws them (.DUCUMENT/bench_serving.md; sglang/benchmark/serving.py and datasets/random.py):
np.random.seed(seed); input lengths randint(int(L*ratio), L+1, size=n); output lengths likewise; prompt offsets
randint(0, vocab_size, size=n); then, after sending request i, it sleeps np.random.exponential(1/rate). numpy's
legacy RandomState stream is stable across numpy versions, so the same calls here give the same numbers.
Only `--random-range-ratio 1.0` is reproduced (fixed lengths), as in our comparison.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from tracebench.trace.format import format_request_line, write_trace


def bench_serving_arrivals(rate: float, num_prompts: int, input_len: int, output_len: int, vocab_size: int,
                           seed: int) -> np.ndarray:
    np.random.seed(seed)
    np.random.randint(input_len, input_len + 1, size=num_prompts)  # input lengths (range ratio 1.0)
    np.random.randint(output_len, output_len + 1, size=num_prompts)  # output lengths
    np.random.randint(0, vocab_size, size=num_prompts)  # prompt offsets
    gaps = np.array([np.random.exponential(1.0 / rate) for _ in range(num_prompts)])  # one per sent request
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, required=True)
    parser.add_argument("--rate", type=float, default=8.0)
    parser.add_argument("--num-prompts", type=int, default=400)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    arrivals = bench_serving_arrivals(args.rate, args.num_prompts, args.input_len, args.output_len, args.vocab_size,
                                      args.seed)
    header = {
        "num_requests": args.num_prompts, "duration_s": round(float(arrivals[-1]), 6),
        "generator": "bench/gpu/bench_serving_trace.py",
        "replicates": "sglang 0.5.17 bench_serving --dataset-name random-ids --random-range-ratio 1.0 arrivals",
        "args": vars(args) | {"output": str(args.output)},
    }
    lines = (format_request_line(i, float(t), args.input_len, args.output_len) for i, t in enumerate(arrivals))
    print(write_trace(args.output, header, lines))


if __name__ == "__main__":
    main()

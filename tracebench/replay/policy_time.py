"""Time spent inside the routing policy. A policy runs on the replay's event loop: while `assign` or `on_complete`
runs, no request is released, dispatched or read, so a slow policy makes every request waiting through it look
slower than the server made it (a 5 s sleep in assign gave 5.01 s client latency against the server's 0.005 s).
The router times every call (`PolicyTime.call`); run.json `policy_time` keeps the figures, each record the policy
time it waited through (`policy_s`), and the run warns at the end when one call took longer than the bound."""

from __future__ import annotations

import time
from array import array
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from tracebench.errors import PolicyError

T = TypeVar("T")

WARN_CALL_S = 0.02  # one call longer than this holds the loop long enough to distort latencies visibly (20 ms)


class PolicyTime:
    """Per-call times of `assign` and `on_complete` (host seconds); `total` (seconds of run time the calls held the
    loop, both kinds) only grows. `in_run_time` False (--clock virtual): a call takes no time on the run's clock
    (the virtual loop waits for it), so `total`, what the records' policy_s are made of, stays 0; the per-call host
    times are still kept (run.json policy_time)."""

    def __init__(self, name: str, in_run_time: bool = True) -> None:
        self.name = name
        self.in_run_time = in_run_time
        self.total = 0.0
        self._calls: dict[str, array[float]] = {"assign": array("d"), "on_complete": array("d")}

    def call(self, kind: str, fn: Callable[..., T], *args: Any) -> T:
        """fn(*args), timed. Whatever it raises (SystemExit and KeyboardInterrupt included: it is the policy's own
        doing, the loop handles the real signals) is the policy's failure: a PolicyError naming it."""
        start = time.perf_counter()
        try:
            return fn(*args)
        except PolicyError:
            raise  # already names the policy (a rule the router checks inside fn, e.g. router.check_picks in a PD round)
        except BaseException as err:
            said = f": {err}" if str(err) else ""
            raise PolicyError(f"policy {self.name!r} raised {type(err).__name__} in {kind}{said}") from err
        finally:
            took = time.perf_counter() - start
            if self.in_run_time:
                self.total += took
            self._calls[kind].append(took)

    def summary(self) -> dict[str, Any]:
        """run.json `policy_time` (without the warning)."""
        out: dict[str, Any] = {}
        for kind, times in self._calls.items():
            values = np.frombuffer(times, dtype=np.float64) if len(times) else np.empty(0)
            out[kind] = {
                "calls": int(values.size),
                "total_s": float(values.sum()),
                "p50_s": float(np.percentile(values, 50)) if values.size else None,
                "p99_s": float(np.percentile(values, 99)) if values.size else None,
                "max_s": float(values.max()) if values.size else None,
            }
        out["warn_call_s"] = WARN_CALL_S
        return out

    def warning(self) -> str | None:
        """One line when a call took longer than WARN_CALL_S, else None."""
        summary = self.summary()
        longest = max((s["max_s"] or 0.0) for s in (summary["assign"], summary["on_complete"]))
        if longest <= WARN_CALL_S or not self.in_run_time:
            return None  # on the virtual clock a call costs wall time only: no latency is made longer by it
        # each kind on its own (they were counted together: "in 40 calls" of which 20 were on_complete)
        kinds = "; ".join(
            f"{kind}: {s['calls']} call(s), {s['total_s']:.3f} s, longest call {s['max_s'] * 1000:.0f} ms, p99 "
            f"{s['p99_s'] * 1000:.1f} ms" for kind in ("assign", "on_complete") if (s := summary[kind])["calls"])
        return (f"policy {self.name!r} held the replay loop for {self.total:.3f} s ({kinds}), over the bound of "
                f"{WARN_CALL_S * 1000:.0f} ms per call: nothing is released, sent or read meanwhile, so the latencies of the requests waiting "
                "through such a call are too long by up to that much (requests.jsonl policy_s; run.json policy_time)")

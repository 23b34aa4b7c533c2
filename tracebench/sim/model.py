"""The timing model of the simulated sglang server: a continuous-batching scheduler loop, pure Python.

No asyncio and no clock in here: the caller passes times in (the server passes real monotonic seconds, the tests and
`bench/bench_sim_fidelity.py` a virtual clock), so the same code is unit-tested with a fake clock and served live.

Like sglang 0.5.17's default scheduler (fcfs, no mixed chunk, no overlap of prefill with decode):
- requests wait in one FCFS queue; at most `max_running_requests` run at once;
- a request reserves `input_len + max_new_tokens` KV slots of `max_total_num_tokens` when admitted (so it is never
  retracted); the head of the queue that does not fit blocks the ones behind it, as in sglang's fcfs;
- each iteration is a prefill step when a waiting request can be admitted (up to `chunked_prefill_size` new tokens;
  a longer input is split into chunks that run in consecutive prefill steps), else a decode step that gives one token
  to every running request; a prefill step pauses decoding;
- the prefill step samples the first output token; each decode step one more.
Step durations come from a `Profile` (tracebench/profiles.py) divided by `speed`.

With the radix cache on (sglang's default; `radix.py`, `.DUCUMENT/radix-cache.md`), a request that carries its token
ids is matched against the cache when admitted: the longest cached prefix (at most input_len - 1 tokens) is its
`cached_tokens`, is not prefilled again (the step is costed for the uncached tokens, attending to the cached ones) and
is not reserved again (the request locks it). A prefill step's tokens enter the cache, and a finished request's KV
(prompt and output) stays there, when the step's result is processed: with the overlap scheduler that is after the
next step was planned, so requests prefilled in one step, or in two back-to-back steps, do not hit each other. When a
request does not fit in KV, unlocked cache entries are evicted, least recently used first.

PD disaggregation (`pd.py` holds the roles and the handshake): a prefill server is this model with max_new_tokens 1.
A decode server's requests never prefill here: `prealloc` reserves a request's KV before its prefill ran (sglang's
DecodePreallocQueue), `arrive` says its KV came, and a zero-length "prebuilt" step admits arrived requests into the
running batch with their first token (sampled by the prefill server) already there (sglang's prebuilt batch,
.DUCUMENT/pd-disaggregation.md section 3); then they decode as usual.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum

from tracebench.errors import ConfigError
from tracebench.profiles import Profile
from tracebench.sim.radix import Node, RadixCache, extended

# sglang's overlap loop plans step N+1 right after launching step N. After an idle GPU nothing delays that but the CPU
# launch of step N (a prefill: a few ms), so requests arriving that soon after an idle-start step still join step N+1.
# 7 ms is what the burst of 8 in prefix-cache-h200.json implies (.DUCUMENT/radix-cache.md); divided by the speed.
IDLE_LAUNCH_LAG_S = 0.007


def resolve_max_running_requests(requested: int | None, max_total_num_tokens: int, context_length: int) -> int:
    """sglang 0.5.17's resolution of --max-running-requests (kv_cache_configurator.resolve_max_num_reqs): the flag
    capped at half the KV pool, or by default clamp(kv / context * 512, 2048, 4096), also capped at half the pool."""
    if requested is None:
        requested = min(max(int(max_total_num_tokens / context_length * 512), 2048), 4096)
    return max(1, min(requested, max_total_num_tokens // 2))


def sglang_max_new_tokens(asked: int, input_len: int, context_length: int, max_total_num_tokens: int,
                          page_size: int = 1) -> int:
    """The max_new_tokens sglang 0.5.17's scheduler gives a request that asked for `asked` (scheduler.py L2132-2141
    init_req_max_new_tokens): max(0, min(asked, max_req_len - input_len - 1, max_total_num_tokens -
    ceil_page(input_len) - page_size - 1)) with max_req_len = min(context_len - 1, max_total_num_tokens - 1)
    (tp_worker.py L509-513). So a 4096 context generates the whole answer only when input_len + asked <= 4094,
    although the request is accepted (200) up to 4096."""
    max_req_len = min(context_length - 1, max_total_num_tokens - 1)
    paged_input = -(-input_len // page_size) * page_size
    return max(0, min(asked, max_req_len - input_len - 1, max_total_num_tokens - paged_input - page_size - 1))


@dataclass(frozen=True)
class Limits:
    """The scheduler limits in force (server flags override the profile's)."""

    max_running_requests: int
    max_total_num_tokens: int
    chunked_prefill_size: int
    # sglang's overlap scheduler plans step N+1 while step N runs on the GPU, so a request that arrives during step N
    # can join step N+2 at the earliest (unless the GPU would otherwise idle).
    overlap_schedule: bool = True
    radix_cache: bool = True   # sglang's prefix cache (off: --disable-radix-cache)


class ReqState(Enum):
    WAITING = "waiting"
    PREALLOCATED = "preallocated"  # PD decode: KV reserved, its KV not here yet (or here, not yet admitted)
    RUNNING = "running"      # admitted: prefilling (possibly chunked) or decoding
    FINISHED = "finished"
    ABORTED = "aborted"


@dataclass(eq=False, slots=True)
class SimRequest:
    """One request inside the model. Times are in the caller's clock (seconds)."""

    rid: str
    input_len: int
    max_new_tokens: int
    t_ready: float                      # entered the waiting queue
    input_ids: Sequence | None = None   # the prompt's tokens, matched in the prefix cache (None: unique content)
    state: ReqState = ReqState.WAITING
    prefilled: int = 0                  # input tokens in KV so far (the cached prefix included)
    cached_tokens: int = 0              # sglang's meta_info.cached_tokens: the prefix found in the cache at admission
    kv_private: int = 0                 # KV slots reserved for it alone (not held by the cache)
    cache_owned: int = 0                # leading input tokens whose KV the cache holds (locked by this request)
    cache_node: Node | None = None      # where its locked path in the cache ends (None: it does not use the cache)
    output_len: int = 0                 # output tokens sampled so far
    t_forward_entry: float | None = None
    t_prefill_finished: float | None = None
    t_finished: float | None = None     # the step end that sampled its last token
    abort_requested: bool = False
    t_arrived: float | None = None      # PD decode: when its KV arrived from the prefill server

    @property
    def kv_needed(self) -> int:
        """KV slots it needs without any cache hit."""
        return self.input_len + self.max_new_tokens

    @property
    def kv_used(self) -> int:
        """KV slots holding real tokens now (the rest of the reservation fills up as it decodes)."""
        return self.prefilled + self.output_len


@dataclass(eq=False, slots=True)
class Step:
    kind: str                            # "prefill", "decode" or "prebuilt" (PD decode: admits arrived KV, no GPU time)
    t_start: float
    t_end: float
    requests: list[SimRequest]           # prefill: the requests with a chunk in it; decode: the batch
    chunk_tokens: list[int] = field(default_factory=list)  # prefill: new tokens per request
    batch_tokens: int = 0                # prefill: new tokens; decode: KV tokens attended
    cached_tokens: int = 0               # prefill: cache hits of the requests admitted in it
    # a decode run (`BatchModel.start_decode_run`): the starts of its consecutive decode steps (the first is
    # t_start; each ends where the next starts, the last at t_end); None: one step
    run_starts: list[float] | None = None

    @property
    def step_ends(self) -> list[float]:
        """Where each of its steps ends (one for a single step)."""
        if self.run_starts is None:
            return [self.t_end]
        return [*self.run_starts[1:], self.t_end]


@dataclass(slots=True)
class StepResult:
    step: Step
    produced: list[SimRequest]           # got one more output token at step.t_end
    finished: list[SimRequest]           # done (last token at step.t_end), KV freed
    aborted: list[SimRequest]            # dropped at this step boundary, KV freed


class BatchModel:
    """The scheduler state. Drive it with `next_start` / `start_step` / `finish_step` (one step at a time)."""

    def __init__(self, profile: Profile, limits: Limits, speed: float = 1.0) -> None:
        if speed <= 0:
            raise ConfigError(f"--speed must be > 0, got {speed}")
        self.profile = profile
        self.limits = limits
        self.speed = speed
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []       # decoding
        self.chunked: SimRequest | None = None    # admitted, input partly prefilled
        self.admitted: set[SimRequest] = set()   # every RUNNING request
        # PD decode: requests whose KV is reserved, before it came (preallocated) and after (arrived, FIFO)
        self.preallocated: set[SimRequest] = set()
        self.arrived: deque[SimRequest] = deque()
        # sglang's run-time admission cap (/set_internal_state pp_max_micro_batch_size), within [1, max_running]
        self.admission_cap = limits.max_running_requests
        self.kv_reserved = 0                      # slots reserved by requests, outside the cache
        self.cache = RadixCache() if limits.radix_cache else None
        # cache work of finished steps not yet "processed" (sglang processes a step's result after planning the next)
        self.unprocessed: list[tuple[SimRequest, bool]] = []   # (request, released: finished or aborted)
        self._tail_tags = itertools.count(1)
        self.current: Step | None = None
        self.last_start: float | None = None
        self.last_end: float | None = None
        self.last_from_idle = False               # the last step started on an idle GPU (no step right before it)
        # counters for /metrics and /v1/loads
        self.total_prefill_tokens = 0
        self.total_prefill_busy_s = 0.0
        self.total_generated_tokens = 0
        self.num_steps = 0
        # sglang's /v1/loads decode_moments: [n_steps, sum b, sum t_us, sum b^2, sum b*t_us, sum generated]
        self.decode_moments: list[float] | None = None

    # ---- queries ----
    @property
    def num_running(self) -> int:
        """Admitted requests: decoding, or prefilling (in the step under way or with a chunk pending)."""
        return len(self.admitted)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    @property
    def num_decoding(self) -> int:
        """Requests in the running (decode) batch: what sglang reports as num_running_reqs."""
        return len(self.running)

    def set_admission_cap(self, cap: int) -> None:
        """Admit new requests only while fewer than `cap` run (running ones are never preempted)."""
        if not 1 <= cap <= self.limits.max_running_requests:
            raise ValueError(f"admission cap {cap} outside [1, {self.limits.max_running_requests}]")
        self.admission_cap = cap

    @property
    def num_preallocated(self) -> int:
        """PD decode: requests with KV reserved whose KV has not arrived (sglang's transfer queue)."""
        return len(self.preallocated) - len(self.arrived)

    def kv_used_tokens(self) -> int:
        """KV slots holding tokens now, the cache's locked entries included (sglang's num_used_tokens)."""
        used = sum(r.kv_used - r.cache_owned for r in self.admitted)
        used += sum(r.input_len for r in self.preallocated)  # PD decode: pages allocated for the KV on its way
        if self.cache is not None:
            used += self.cache.total_tokens - self.cache.evictable_tokens
        return used

    def is_idle(self) -> bool:
        return not self.admitted and not self.waiting and not self.preallocated and self.current is None

    def flush_cache(self) -> bool:
        """sglang's /flush_cache: empty the prefix cache, only when nothing runs or waits. Returns whether it did."""
        if not self.is_idle():
            return False
        self.process_results()
        if self.cache is not None:
            self.cache.reset()
        return True

    # ---- requests ----
    def submit(self, req: SimRequest) -> None:
        """Queue a request; it may be admitted by a step starting at or after `req.t_ready`."""
        if req.kv_needed > self.limits.max_total_num_tokens:
            raise ValueError(f"request needs {req.kv_needed} KV tokens, capacity is {self.limits.max_total_num_tokens}")
        if self.waiting and req.t_ready < self.waiting[-1].t_ready:
            raise ValueError("requests must be submitted in order of t_ready (FCFS)")
        self.waiting.append(req)

    def abort(self, req: SimRequest) -> bool:
        """Abort a request (client went away). A waiting one leaves the queue now; an admitted one frees its slot and
        KV at the next step boundary, like sglang's abort. Returns False when it had already finished."""
        if req.state is ReqState.WAITING:
            if req in self.waiting:  # a PD request may not have reached the model yet (bootstrap, pre-allocation)
                self.waiting.remove(req)
            req.state = ReqState.ABORTED
            return True
        if req.state is ReqState.PREALLOCATED:
            self.preallocated.discard(req)
            if req in self.arrived:
                self.arrived.remove(req)
            self.kv_reserved -= req.kv_private
            req.kv_private = 0
            req.state = ReqState.ABORTED
            return True
        if req.state is ReqState.RUNNING:
            req.abort_requested = True
            if self.current is None:
                self._drop(req)
            return True
        return False

    def _drop(self, req: SimRequest) -> None:
        if req in self.running:
            self.running.remove(req)
        if self.chunked is req:
            self.chunked = None
        self._release(req, ReqState.ABORTED)

    def _release(self, req: SimRequest, state: ReqState) -> None:
        self.admitted.discard(req)
        req.state = state
        if req.cache_node is not None:
            self.unprocessed.append((req, True))   # its KV goes to the cache when the step's result is processed
        else:
            self.kv_reserved -= req.kv_private

    def process_results(self) -> None:
        """Apply the cache work of finished steps (sglang's process_batch_result: cache_unfinished_req after a prefill
        chunk, cache_finished_req when a request is done): tokens move from the request's reservation to the cache
        (copies of tokens the cache already holds are freed), the request's lock moves to its new path end."""
        if not self.unprocessed:
            return
        cache = self.cache
        for req, released in self.unprocessed:
            assert cache is not None and req.cache_node is not None and req.input_ids is not None
            if released:
                if req.state is ReqState.FINISHED and req.output_len > 1:
                    # output KV stays cached too; the sim's outputs are not matched (a unique tag: never sent back)
                    tail = req.output_len - 1
                    cache.insert(extended(req.input_ids, req.prefilled, -next(self._tail_tags), tail),
                                 req.prefilled + tail)
                elif req.prefilled > req.cache_owned:
                    cache.insert(req.input_ids, req.prefilled)
                cache.unlock(req.cache_node)
                req.cache_node = None
                self.kv_reserved -= req.kv_private
                req.kv_private = 0
                continue
            if req.prefilled <= req.cache_owned:
                continue
            _, node = cache.insert(req.input_ids, req.prefilled)
            cache.lock(node)
            cache.unlock(req.cache_node)
            req.cache_node = node
            moved = req.prefilled - req.cache_owned
            req.kv_private -= moved
            self.kv_reserved -= moved
            req.cache_owned = req.prefilled
        self.unprocessed.clear()

    # ---- PD decode ----
    def prealloc(self, req: SimRequest) -> bool:
        """PD decode: reserve `req`'s KV (input + max_new_tokens) before its prefill ran, as sglang's
        pop_preallocated does when a request slot and KV are free (decode.py L894-1308; no prefix cache on a decode
        server). False: it does not fit now (the caller keeps FIFO order and tries again when something frees)."""
        if req.state is not ReqState.WAITING or req in self.waiting:
            raise ValueError("prealloc takes a request that was not submitted")
        if req.kv_needed > self.limits.max_total_num_tokens:
            raise ValueError(f"request needs {req.kv_needed} KV tokens, capacity is {self.limits.max_total_num_tokens}")
        if len(self.admitted) + len(self.preallocated) >= self.limits.max_running_requests:
            return False  # sglang's req_to_token_pool: running + pre-allocated requests
        held, evictable = (0, 0) if self.cache is None else (self.cache.total_tokens, self.cache.evictable_tokens)
        if self.kv_reserved + held - evictable + req.kv_needed > self.limits.max_total_num_tokens:
            return False
        over = self.kv_reserved + held + req.kv_needed - self.limits.max_total_num_tokens
        if over > 0 and self.cache is not None and self.cache.evict(over) < over:
            raise RuntimeError(f"prefix cache evicted less than the {over} evictable tokens it was asked for")
        req.kv_private = req.kv_needed
        self.kv_reserved += req.kv_needed
        req.state = ReqState.PREALLOCATED
        self.preallocated.add(req)
        return True

    def arrive(self, req: SimRequest, t_arrived: float) -> None:
        """PD decode: `req`'s KV (and first token) arrived at `t_arrived`; a prebuilt step admits it from then on."""
        if req.state is not ReqState.PREALLOCATED or req in self.arrived:
            raise ValueError(f"KV arrived for request {req.rid}, which is not pre-allocated and waiting for it")
        if self.arrived and t_arrived < self.arrived[-1].t_arrived:  # type: ignore[operator]
            raise ValueError("KV arrivals must come in time order")
        req.t_arrived = req.t_ready = t_arrived
        self.arrived.append(req)

    # ---- the loop ----
    def next_start(self, t_free: float) -> float | None:
        """When the next step can start, given the GPU is free from `t_free`: `t_free` itself when something can run
        then, the head-of-queue's ready time when the GPU would idle until it arrives, None when there is no work."""
        if self.running or self.chunked is not None:
            return t_free
        heads = [q[0].t_ready for q in (self.waiting, self.arrived) if q]
        if heads:
            return max(t_free, min(heads))
        return None

    def _shared_prefix_repeats(self) -> int:
        """KV tokens the running requests read through a prompt prefix that another running request holds too: each
        locks the cache path of its prompt (cache_owned tokens); a node on several paths is one set of pages, so the
        owned tokens beyond the distinct ones are read again (sglang's triton kernel reads them once per request,
        the later reads partly from L2: the profile's decode_attention.shared_saving)."""
        if self.cache is None:
            return 0
        owned = 0
        distinct = 0
        seen: set[int] = set()
        for r in self.running:
            if r.cache_node is None:
                continue
            owned += r.cache_owned
            node = r.cache_node
            while node is not None and id(node) not in seen:
                seen.add(id(node))
                distinct += len(node.key)
                node = node.parent
        return owned - distinct

    def start_step(self, t_start: float) -> Step | None:
        """Plan the step that starts at `t_start` (only requests ready by then are admitted). None: nothing to do."""
        if self.current is not None:
            raise RuntimeError("start_step while a step is under way")
        cutoff = t_start
        overlapped = self.limits.overlap_schedule and self.last_end == t_start and self.last_start is not None
        if overlapped:
            # planned while the previous step ran, once the scheduler had processed the result before it (R after the
            # previous step's start; after an idle GPU, after the CPU launch of the previous step)
            lag = max(self.profile.plan_lag_s, IDLE_LAUNCH_LAG_S) if self.last_from_idle else self.profile.plan_lag_s
            cutoff = min(t_start, self.last_start + lag / self.speed)
        else:
            self.process_results()
        from_idle = self.last_end != t_start   # the GPU idled before this step (or it is the first)
        step = self._plan_prebuilt(t_start, cutoff) or self._plan_prefill(t_start, cutoff)
        if step is None and self.running:
            profile = self.profile
            if profile.decode_attention is None:   # the linear step: no list of contexts per step
                kv = sum([r.prefilled + r.output_len for r in self.running])  # each one's kv_used
                duration = (profile.decode_base_s + profile.decode_per_req_s * len(self.running)
                            + profile.decode_per_kv_token_s * kv)
            else:
                contexts = [r.kv_used for r in self.running]
                kv = sum(contexts)
                duration = profile.decode_duration(contexts, self._shared_prefix_repeats())
            step = Step("decode", t_start, t_start + duration / self.speed, list(self.running), batch_tokens=kv)
        if step is None and (cutoff < t_start or self.unprocessed):
            # the GPU would idle: the next loop turn has processed the last result and picks up the new arrivals
            self.process_results()
            step = self._plan_prebuilt(t_start, t_start) or self._plan_prefill(t_start, t_start)
        if step is not None:
            self.current = step
            self.num_steps += 1
            self.last_start, self.last_end = step.t_start, step.t_end
            self.last_from_idle = from_idle
        self.process_results()
        return step

    def start_decode_run(self, t_start: float, max_steps: int) -> Step | None:
        """`start_step(t_start)`, and when that is a decode step that nothing can change, the decode steps after it
        as one run of up to `max_steps`: each step is planned exactly as `start_step` would plan it at its start
        (same batch, one more KV token per request each step, the same costs summed in the same order), so a run
        is a shorthand for steps, not an approximation. Nothing can change them while nothing waits (no queue, no
        chunk, no KV on its way: a step after a new arrival is for `start_step` to plan again: `cut_run`) and no
        request of the batch finishes before the run's last step or is aborted. Only a caller on a simulated clock
        uses it (sim/inprocess.py): a real-time server hands out every step's tokens as they come."""
        step = self.start_step(t_start)
        if (step is None or step.kind != "decode" or max_steps < 2 or self.waiting or self.arrived
                or self.chunked is not None):
            return step
        batch = step.requests
        steps_left = max_steps
        for req in batch:
            if req.abort_requested:
                return step
            steps_left = min(steps_left, req.max_new_tokens - req.output_len)  # its last token ends the run
        if steps_left < 2:
            return step
        starts = [t_start]
        t = step.t_end
        profile, speed = self.profile, self.speed
        if profile.decode_attention is None:
            # the linear step needs only the batch's size and KV (decode_step_s's own sum, one step at a time)
            size, kv = len(batch), step.batch_tokens
            per_kv = profile.decode_per_kv_token_s
            fixed = profile.decode_base_s + profile.decode_per_req_s * size   # the sum's first two terms, as added
            for _ in range(steps_left - 1):
                kv += size  # each step gave every request one more token to attend to
                starts.append(t)
                t = t + (fixed + per_kv * kv) / speed
        else:
            contexts = [r.kv_used for r in batch]
            # the steps after the first are planned once start_step has processed the last results: the cache paths
            # the batch locks (its shared prefixes) are then what they stay for the run
            shared = self._shared_prefix_repeats()
            while len(starts) < steps_left:
                grown = len(starts)  # each step gave every request one more token to attend to
                starts.append(t)
                t = t + profile.decode_duration([c + grown for c in contexts], shared) / speed
        step.run_starts = starts
        step.t_end = t
        self.num_steps += len(starts) - 1
        self.last_start, self.last_end = starts[-1], t
        self.last_from_idle = False
        return step

    def cut_run(self, step: Step, now: float) -> None:
        """Something arrived at `now` while a decode run was under way: the run keeps the steps that had started by
        then (the last of them is under way; what arrived is for the steps after it, planned anew)."""
        starts = step.run_starts
        if step is not self.current or starts is None:
            raise RuntimeError("cut_run for a step that is not a decode run under way")
        keep = bisect.bisect_right(starts, now)
        if keep >= len(starts):
            return
        step.t_end = starts[keep]
        self.num_steps -= len(starts) - keep
        del starts[keep:]
        self.last_start, self.last_end = starts[-1], step.t_end
        if len(starts) == 1:
            step.run_starts = None

    def _plan_prebuilt(self, t_start: float, cutoff: float) -> Step | None:
        """PD decode: arrived requests join the running batch (sglang's get_new_prebuilt_batch: up to the free
        running slots, FIFO), taking no GPU time; their first token goes out at the step's end."""
        if not self.arrived:
            return None
        reqs: list[SimRequest] = []
        slots = self.admission_cap - len(self.admitted)
        while slots > 0 and self.arrived and self.arrived[0].t_ready <= cutoff:
            req = self.arrived.popleft()
            self.preallocated.discard(req)
            req.state = ReqState.RUNNING
            self.admitted.add(req)
            req.t_forward_entry = t_start
            reqs.append(req)
            slots -= 1
        if not reqs:
            return None
        return Step("prebuilt", t_start, t_start, reqs)

    def _plan_prefill(self, t_start: float, cutoff: float) -> Step | None:
        # sglang's PrefillAdder (.DUCUMENT/scheduler-loop.md): a request whose tokens fit the chunk budget left is
        # taken whole, else cut to it (schedule_policy.py L1195-1253), while budget is left (budget_state L718-740);
        # only requests the plan's poll found in the queue (ready by `cutoff`) are seen (scheduler.py L1731-1738)
        if self.chunked is None and (not self.waiting or self.waiting[0].t_ready > cutoff):
            return None   # nothing to prefill (most steps: decoding, nothing new)
        budget = self.limits.chunked_prefill_size
        reqs: list[SimRequest] = []
        chunks: list[int] = []
        costed: list[tuple[int, int]] = []
        if self.chunked is not None:
            req = self.chunked
            take = min(budget, req.input_len - req.prefilled)
            reqs.append(req)
            chunks.append(take)
            costed.append((req.prefilled, take))
            budget -= take
        slots = self.admission_cap - len(self.admitted)
        while budget > 0 and slots > 0 and self.waiting:
            req = self.waiting[0]
            if req.t_ready > cutoff:
                break
            if not self._reserve(req):
                break  # fcfs: the head waits for KV, the rest wait behind it
            self.waiting.popleft()
            req.state = ReqState.RUNNING
            self.admitted.add(req)
            req.t_forward_entry = t_start
            take = min(budget, req.input_len - req.prefilled)
            reqs.append(req)
            chunks.append(take)
            costed.append((req.prefilled, take))
            budget -= take
            slots -= 1
            if req.prefilled + take < req.input_len:
                self.chunked = req
                break
        if not reqs:
            return None
        new_tokens = sum(chunks)
        duration = self.profile.prefill_duration(costed) / self.speed
        hits = sum(r.cached_tokens for r in reqs if r.t_forward_entry == t_start)   # newly admitted ones
        return Step("prefill", t_start, t_start + duration, reqs, chunk_tokens=chunks, batch_tokens=new_tokens,
                    cached_tokens=hits)

    def _reserve(self, req: SimRequest) -> bool:
        """Match `req` in the cache and reserve its KV (evicting unlocked cache entries if needed). False: it does
        not fit now (nothing changed but the cache's LRU order and node boundaries)."""
        cache = self.cache
        cached, node = 0, None
        if cache is not None and req.input_ids is not None:
            # sglang never matches the whole prompt: at least one token is prefilled (schedule_batch.py
            # _compute_max_prefix_len: input_len - 1)
            cached, node = cache.match(req.input_ids, req.input_len - 1)
            cache.lock(node)
        need = req.kv_needed - cached
        held, evictable = (0, 0) if cache is None else (cache.total_tokens, cache.evictable_tokens)
        if self.kv_reserved + held - evictable + need > self.limits.max_total_num_tokens:
            if node is not None:
                cache.unlock(node)  # type: ignore[union-attr]
            return False
        over = self.kv_reserved + held + need - self.limits.max_total_num_tokens
        if over > 0 and cache is not None and cache.evict(over) < over:
            raise RuntimeError(f"prefix cache evicted less than the {over} evictable tokens it was asked for")
        req.cached_tokens = req.prefilled = req.cache_owned = cached
        req.cache_node = node
        req.kv_private = need
        self.kv_reserved += need
        return True

    def finish_step(self, step: Step) -> StepResult:
        """Apply the step's outcome at `step.t_end`."""
        if step is not self.current:
            raise RuntimeError("finish_step for a step that is not under way")
        self.current = None
        t_end = step.t_end
        produced: list[SimRequest] = []
        finished: list[SimRequest] = []
        aborted: list[SimRequest] = []
        if step.kind == "prebuilt":
            for req in step.requests:
                req.prefilled = req.input_len
                if req.abort_requested:
                    self._release(req, ReqState.ABORTED)
                    aborted.append(req)
                    continue
                if req.max_new_tokens > 0:
                    req.output_len = 1   # the prefill server's token, handed out now (no forward pass)
                    produced.append(req)
                if req.output_len >= req.max_new_tokens:
                    self._finish(req, t_end)
                    finished.append(req)
                else:
                    self.running.append(req)
        elif step.kind == "prefill":
            self.total_prefill_tokens += step.batch_tokens
            self.total_prefill_busy_s += t_end - step.t_start
            for req, take in zip(step.requests, step.chunk_tokens):
                req.prefilled += take
                if req.cache_node is not None:
                    self.unprocessed.append((req, False))
                if req.abort_requested:
                    if self.chunked is req:
                        self.chunked = None
                    self._release(req, ReqState.ABORTED)
                    aborted.append(req)
                    continue
                if req.prefilled < req.input_len:
                    continue  # more chunks to go (it stays self.chunked)
                if self.chunked is req:
                    self.chunked = None
                req.t_prefill_finished = t_end
                if req.max_new_tokens > 0:
                    req.output_len = 1
                    self.total_generated_tokens += 1
                    produced.append(req)
                if req.output_len >= req.max_new_tokens:
                    self._finish(req, t_end)
                    finished.append(req)
                else:
                    self.running.append(req)
        else:
            self._finish_decode(step, produced, finished, aborted)
        return StepResult(step, produced, finished, aborted)

    def _finish_decode(self, step: Step, produced: list[SimRequest], finished: list[SimRequest],
                       aborted: list[SimRequest]) -> None:
        """finish_step's decode step, or run of them (start_decode_run: no request is aborted or finishes before
        its last step)."""
        t_end = step.t_end
        steps = 1 if step.run_starts is None else len(step.run_starts)
        still_running: list[SimRequest] = []
        for req in self.running:
            if req.abort_requested:
                self._release(req, ReqState.ABORTED)
                aborted.append(req)
                continue
            out = req.output_len = req.output_len + steps
            produced.append(req)
            if out >= req.max_new_tokens:
                self._finish(req, t_end)
                finished.append(req)
            else:
                still_running.append(req)
        n = len(produced)
        self.total_generated_tokens += n * steps
        self.running = still_running
        b = len(step.requests)
        n_steps, sum_b, sum_t, sum_b2, sum_bt, sum_gen = self.decode_moments or (0.0,) * 6
        # the durations' sums step by step, as one step at a time would add them (the same floats); the others are
        # whole numbers, which a float adds exactly (below 2**53), so they are added at once
        t_start = step.t_start
        for end in step.step_ends:
            t_us = (end - t_start) * 1e6
            sum_t += t_us
            sum_bt += b * t_us
            t_start = end
        self.decode_moments = [n_steps + steps, sum_b + b * steps, sum_t, sum_b2 + b * b * steps, sum_bt,
                               sum_gen + n * steps]

    def _finish(self, req: SimRequest, t_end: float) -> None:
        req.t_finished = t_end
        self._release(req, ReqState.FINISHED)


def token_ids(request_seed: int, n: int, vocab_size: int) -> list[int]:
    """Deterministic pseudo-random output ids of one request (a cheap integer hash, no RNG object per request)."""
    out = []
    x = request_seed & 0xFFFFFFFFFFFFFFFF
    for _ in range(n):
        # splitmix64 step
        x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        z = x
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
        out.append((z ^ (z >> 31)) % vocab_size)
    return out


@dataclass(frozen=True)
class Outcome:
    """One request's times in a virtual-clock run (seconds; client-side figures include the profile's
    client overhead, as a client over real HTTP would see them)."""

    t_arrival: float
    input_len: int
    output_len: int
    t_forward_entry: float
    t_first_token: float     # first token visible to the HTTP layer
    t_finished: float        # last token visible to the HTTP layer
    ttft: float              # client-side time to first token
    e2e: float               # client-side end-to-end latency
    server_e2e: float        # sglang's e2e_latency (received -> finished)
    t_prefill_finished: float = 0.0
    cached_tokens: int = 0   # sglang's meta_info.cached_tokens

    @property
    def tpot(self) -> float:
        """Time per output token after the first (bench_serving's TPOT); 0 for one-token outputs."""
        return (self.e2e - self.ttft) / (self.output_len - 1) if self.output_len > 1 else 0.0


def simulate(profile: Profile, limits: Limits, workload: Sequence[tuple],
             speed: float = 1.0) -> list[Outcome]:
    """Run requests `(arrival_s, input_len, output_len)` or `(arrival_s, input_len, output_len, input_ids)` (sorted
    by arrival; input_ids are matched in the prefix cache) through the model on a virtual clock. Deterministic and
    fast: no sleeping, no asyncio. The arrival is the moment the server receives the request."""
    model = BatchModel(profile, limits, speed)
    entry = profile.queue_entry_s / speed
    output = profile.output_s / speed
    client = profile.client_overhead_s / speed
    reqs: list[SimRequest] = []
    first_step_end: dict[int, float] = {}
    i = 0
    t_free = workload[0][0] if workload else 0.0
    while True:
        t_start = model.next_start(t_free)
        if i < len(workload) and (t_start is None or workload[i][0] + entry <= t_start):
            t_arrival, input_len, output_len = workload[i][:3]
            ids = workload[i][3] if len(workload[i]) > 3 else None
            req = SimRequest(rid=str(i), input_len=input_len, max_new_tokens=output_len, t_ready=t_arrival + entry,
                             input_ids=ids)
            model.submit(req)
            reqs.append(req)
            i += 1
            continue
        if t_start is None:
            break
        step = model.start_step(t_start)
        if step is None:
            raise RuntimeError(f"model had work from {t_start} but planned no step")
        result = model.finish_step(step)
        for req in result.produced:
            if req.output_len == 1:
                first_step_end[id(req)] = step.t_end
        t_free = step.t_end
    outcomes = []
    for item, req in zip(workload, reqs):
        t_arrival, input_len, output_len = item[:3]
        if req.t_finished is None or req.t_forward_entry is None or req.t_prefill_finished is None:
            raise RuntimeError(f"request {req.rid} did not finish")
        t_first = first_step_end.get(id(req), req.t_finished) + output
        t_done = req.t_finished + output
        outcomes.append(Outcome(t_arrival, input_len, output_len, req.t_forward_entry, t_first, t_done,
                                ttft=t_first - t_arrival + client, e2e=t_done - t_arrival + client,
                                server_e2e=t_done - t_arrival, t_prefill_finished=req.t_prefill_finished,
                                cached_tokens=req.cached_tokens))
    return outcomes

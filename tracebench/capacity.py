"""What a trace asks of the servers, against what they have (issue 23): KV capacity beside the trace's prefix working
set, and the offered load as a share of what the servers can serve. `tracebench inspect` prints both, the report
shows them per run and warns when the load is over. docs/trace-format.md ("Capacity") states the rules.

The load is an estimate from the simulator's step costs fitted to a real GPU (tracebench/sim/profiles/, the model
`tracebench/sim/model.py` times steps with), taken at the servers' largest batch, i.e. at their highest throughput:

    per request:  prefill = b * u + q * I^2 * (1 - f^2)             u = I * (1 - f): its uncached prompt tokens
                  decode  = O * (c / B + d + e * (I + O / 2))        one step per output token, shared by B requests
    load          = rate * (prefill + decode) / servers              > 1: more work arrives than the servers can do

with I, O the trace's mean input and output lengths, f the share of prompt tokens a prefix cache can serve (the
trace's ceiling: the best any routing reaches), b, q the prefill costs per token and per token pair, c, d, e a
decode step's fixed cost, cost per request and per KV token, and B the batch a server runs at most: its cap, else
sglang's max_running_requests, and no more requests than its KV holds (KV tokens / (I + O)). Means stand for whole
distributions, and the steps' fixed costs (a, the prefill floor, the scheduler's lag) are left out, so the load is a
lower bound: measured on the simulator (the README's routing example at 40 req/s, 480 requests, 4 servers), runs queued from about 75% of it
(cache_aware served at most 30.7 req/s where the rule says 42), hence the warning from LOAD_WARN on.

The working set (the tokens of prefix blocks two or more requests send) competes in the KV with what the running
requests hold of their own (I * (1 - f) + O each, about min(load, 1) * B of them): the cache has room for

    room = KV - min(load, 1) * B * (I * (1 - f) + O)

per server. Working set <= room: every server can keep every shared prefix, routing by prefix saves little; <= the
servers' rooms together: routing by prefix (each server its share) is what lets the prefixes stay; beyond: every
policy evicts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tracebench.profiles import Profile, builtin_profiles, profiles_of_gpu

# the estimated load from which `inspect` and the report warn: the rule is a lower bound (module doc)
LOAD_WARN = 0.75
# traces shorter than this are not judged: a few requests are a burst, not a load that builds a queue
MIN_REQUESTS = 100


@dataclass(frozen=True)
class Costs:
    """A GPU's step costs for the model (seconds at speed 1) and its KV capacity: a profile's, as the simulator uses."""

    name: str
    accelerator: str
    prefill_per_token_s: float
    prefill_per_token_sq_s: float
    decode_base_s: float
    decode_per_req_s: float
    decode_per_kv_token_s: float
    kv_tokens: int


def _from_profile(profile: Profile) -> Costs:
    # a profile with a decode attention model (profiles.DecodeAttention): a full batch is bound by the programs'
    # throughput, one makespan token per `slots` KV tokens walked, so its cost per KV token is token_s / slots
    attention = profile.decode_attention
    per_kv = profile.decode_per_kv_token_s + (0.0 if attention is None else attention.token_s / attention.slots)
    # a prefill attention model (profiles.PrefillAttention) on a full GPU: its walks / slots, per request
    # heads x (new^2 + 2 new cached) / (2 block_m) tokens: the q of those pairs is token_s x heads / (2 block_m slots)
    extend = profile.prefill_attention
    per_pair = profile.prefill_per_token_sq_s + (
        0.0 if extend is None else extend.token_s * extend.heads / (2 * extend.block_m * extend.slots))
    return Costs(profile.name, profile.accelerator, profile.prefill_per_token_s, per_pair,
                 profile.decode_base_s, profile.decode_per_req_s, per_kv, profile.max_total_num_tokens)


def costs_named(name: str) -> Costs | None:
    """The built-in profile `name` (a simulator's, as its /server_info names it), None when it is not one."""
    found = [p for p in builtin_profiles() if p.name == name]
    return _from_profile(found[0]) if found else None


def costs_of_gpu(gpu: str) -> Costs | None:
    """The built-in profile of the GPU named `gpu` (matched as `sim-server --gpu` matches: profiles.profiles_of_gpu),
    None when no single one is."""
    found = profiles_of_gpu(gpu)
    return _from_profile(found[0]) if len(found) == 1 else None


def costs_of_servers(infos: list[Any], accelerators: list[Any]) -> Costs | None:
    """The costs of a run's servers: the simulators' profile (their /server_info tracebench_sim.profile, one for all),
    else the built-in profile of their GPU (/v1/loads accelerator, one for all); None when neither is known."""
    names = {((info or {}).get("tracebench_sim") or {}).get("profile") for info in infos}
    if len(names) == 1 and None not in names:
        return costs_named(str(names.pop()))
    gpus = set(accelerators)
    if len(gpus) == 1 and None not in gpus:
        return costs_of_gpu(str(gpus.pop()))
    return None


def load_warning(costs: Costs, *, requests: int, rate: float, input_mean: float, output_mean: float,
                 cached_fraction: float, servers: int, cap: int | None) -> str | None:
    """The warning `replay` (at start) and the report give when the offered load of a trace of MIN_REQUESTS requests
    or more passes LOAD_WARN, else None."""
    if requests < MIN_REQUESTS:
        return None
    load = offered_load(costs, rate=rate, input_mean=input_mean, output_mean=output_mean,
                        cached_fraction=cached_fraction, servers=servers, cap=cap)
    if load.share <= LOAD_WARN:
        return None
    return (f"the trace offers {load.share:.0%} of what its {servers} server(s) can serve at best ({rate:.1f} req/s "
            f"against at most {load.capacity_rate:.1f}; {costs.name}, the trace's ceiling as hits; "
            f"docs/trace-format.md \"Capacity\"), past {LOAD_WARN:.0%}: the servers fall behind and queues grow "
            f"through the run, so latencies grow with its length (the backlog) as much as they measure the servers "
            f"and the policy; for a steady state, lower the rate or add servers (tracebench inspect --servers N says "
            f"it before a run)")


@dataclass(frozen=True)
class Load:
    share: float  # of the servers' capacity at the rule's estimate (LOAD_WARN: where it warns)
    capacity_rate: float  # requests/s the servers can serve at this mix, at most
    batch: int  # B, the batch the rule takes
    cache_room: int  # tokens of one server's KV left for cached prefixes beside the running requests (module doc)


def offered_load(costs: Costs, *, rate: float, input_mean: float, output_mean: float, cached_fraction: float,
                 servers: int, cap: int | None = None, max_running_requests: int | None = None) -> Load:
    """The module's rule: the offered load as a share of what `servers` servers with `costs` can serve."""
    per_request_kv = max(1.0, input_mean + output_mean)
    batch = int(costs.kv_tokens // per_request_kv)
    for limit in (cap, max_running_requests):
        if limit is not None:
            batch = min(batch, limit)
    batch = max(batch, 1)
    uncached = input_mean * (1.0 - cached_fraction)
    prefill = (costs.prefill_per_token_s * uncached
               + costs.prefill_per_token_sq_s * input_mean ** 2 * (1.0 - cached_fraction ** 2))
    decode = output_mean * (costs.decode_base_s / batch + costs.decode_per_req_s
                            + costs.decode_per_kv_token_s * (input_mean + output_mean / 2))
    per_request = prefill + decode
    share = rate * per_request / servers
    own = input_mean * (1.0 - cached_fraction) + output_mean  # what a running request holds beside its prefix
    room = int(max(0.0, costs.kv_tokens - min(share, 1.0) * batch * own))
    return Load(share=share, capacity_rate=servers / per_request, batch=batch, cache_room=room)


def working_set_line(shared_tokens: int, room: int, servers: int) -> str:
    """Where the trace's shared prefixes fit beside the running requests (`room` per server), and what that means
    for routing (the module doc's rule)."""
    total = room * servers
    if shared_tokens == 0:
        return "no prefix is shared by two requests: no routing can make the prefix cache hit"
    if shared_tokens <= room:
        return (f"they fit in what one server's KV has beside its running requests (~{room:,} tokens): every server "
                f"can keep all of them, so even round_robin nears the ceiling once each server has seen each prefix; "
                f"routing by prefix saves little")
    if shared_tokens <= total:
        return (f"they need {shared_tokens / max(room, 1):.1f} servers' room (~{room:,} tokens each beside the running "
                f"requests) of the {servers}: spread evenly (random, round_robin) every server must hold all of them "
                f"and evicts; routing by prefix (cache_aware, prefix_hash) gives each server its share, which fits: "
                f"routing matters here")
    return (f"they are {shared_tokens / max(total, 1):.1f}x the room of the {servers} servers together (~{room:,} "
            f"tokens each beside the running requests): even routing by prefix evicts; fewer prefix groups, or more "
            f"servers, before routing can keep them all")

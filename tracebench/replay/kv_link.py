"""`--kv-link`: the KV-cache link between simulated prefill and decode servers (replay/sweep `--backend sim --pd`),
a named preset or explicit figures. A transfer takes latency + bytes / bandwidth, one at a time per prefill server
(tracebench/sim/pd.py KvLink). Light: imported by the CLI.

Where the figures come from:
- tcp: measured by tracebench: sglang 0.5.17's mooncake_tcp between two NVIDIA H200s of one host (2026-11-26;
  reports/examples/h200x2-pd/sim-vs-real.md "The link model", tracebench/sim/args.py): 1.54 GiB/s for back-to-back
  transfers, 0.07 s beyond the bytes for a lone one. The simulator's default.
- rdma-200g, rdma-400g: one RoCE NIC per GPU, at the Mooncake Transfer Engine's published rates (its README,
  "Performance": 87 GB/s over 4 x 200 Gbps and 190 GB/s over 8 x 400 Gbps, 40 GB transfers): per NIC 21.75 GB/s =
  20.26 GiB/s and 23.75 GB/s = 22.12 GiB/s.
- nvlink: the NVLink 4 of an H100 / H200 SXM (NVIDIA's datasheets: 900 GB/s per GPU, both directions together):
  450 GB/s = 419.1 GiB/s one way, the line rate (an upper bound: no copy reaches it).
The rdma and nvlink presets keep the measured per-transfer 0.07 s: no published figure gives sglang's time beyond
the bytes on those links; give BANDWIDTH:LATENCY to assume another."""

from __future__ import annotations

import math
from dataclasses import dataclass

from tracebench.errors import ConfigError

GB_PER_GIB = 2**30 / 1e9


@dataclass(frozen=True)
class KvLink:
    name: str  # a preset's name, or "custom"
    bandwidth_gib_s: float
    latency_s: float
    source: str  # where the figures come from (run.json pd.kv_link.source, the report)

    def describe(self) -> str:
        return f"{self.name}: {self.bandwidth_gib_s:g} GiB/s + {self.latency_s * 1000:g} ms a transfer"

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "bandwidth_gib_s": self.bandwidth_gib_s, "latency_s": self.latency_s,
                "source": self.source}

    def sim_args(self) -> list[str]:
        """The simulated servers' flags for this link (tracebench sim-server)."""
        return ["--kv-transfer-bandwidth", f"{self.bandwidth_gib_s:g}", "--kv-transfer-latency", f"{self.latency_s:g}"]


_MEASURED_LATENCY_S = 0.07
PRESETS = {
    "tcp": KvLink("tcp", 1.54, _MEASURED_LATENCY_S,
                  "measured: sglang 0.5.17 mooncake_tcp, two H200s of one host (reports/examples/h200x2-pd)"),
    "rdma-200g": KvLink("rdma-200g", round(21.75 / GB_PER_GIB, 2), _MEASURED_LATENCY_S,
                        "Mooncake Transfer Engine README: 87 GB/s over 4 x 200 Gbps RoCE, per NIC; + the measured "
                        "0.07 s a transfer"),
    "rdma-400g": KvLink("rdma-400g", round(23.75 / GB_PER_GIB, 2), _MEASURED_LATENCY_S,
                        "Mooncake Transfer Engine README: 190 GB/s over 8 x 400 Gbps RoCE, per NIC; + the measured "
                        "0.07 s a transfer"),
    "nvlink": KvLink("nvlink", round(450 / GB_PER_GIB, 1), _MEASURED_LATENCY_S,
                     "NVIDIA H100/H200 SXM datasheet: NVLink 900 GB/s both ways, 450 one way (line rate); + the "
                     "measured 0.07 s a transfer"),
}
DEFAULT = "tcp"
# the sim-server flags a --kv-link sets: --server-arg must not set them too
SIM_FLAGS = ("--kv-transfer-bandwidth", "--kv-transfer-latency")

HELP = ("--backend sim --pd: the KV link between prefill and decode servers (a transfer takes LATENCY + bytes / "
        "BANDWIDTH, one at a time per prefill server): a preset, " +
        "; ".join(f"{k} ({v.bandwidth_gib_s:g} GiB/s + {v.latency_s * 1000:g} ms)" for k, v in PRESETS.items()) +
        " (figures and sources: docs/pd.md \"The KV link\"), or BANDWIDTH:LATENCY in GiB/s and seconds "
        "(25:0.005). Recorded in run.json pd.kv_link and named in the report. [default: tcp, measured]")


def parse_kv_link(text: str) -> KvLink:
    """A preset name or `BANDWIDTH:LATENCY` (GiB/s, s). ConfigError naming --kv-link otherwise."""
    if text in PRESETS:
        return PRESETS[text]
    bandwidth, sep, latency = text.partition(":")
    try:
        bw, lat = float(bandwidth), float(latency) if sep else math.nan
    except ValueError:
        bw = lat = math.nan
    if not sep or not (math.isfinite(bw) and bw > 0) or not (math.isfinite(lat) and lat >= 0):
        raise ConfigError(f"--kv-link {text}: expected a preset ({', '.join(PRESETS)}) or BANDWIDTH:LATENCY "
                          f"(GiB/s > 0 and seconds >= 0, e.g. 25:0.005)")
    return KvLink("custom", bw, lat, "given: --kv-link " + text)


def check_kv_link(text: str | None, backend: str, is_pd: bool, server_args: list[str]) -> KvLink | None:
    """The link a run's servers get: --kv-link only with --backend sim and PD (a real link is the hardware's), never
    beside --server-arg --kv-transfer-bandwidth/latency; a simulated PD run without it gets the default preset."""
    given = [word.split("=", 1)[0] for word in server_args if word.split("=", 1)[0] in SIM_FLAGS]
    if text is not None:
        if backend != "sim" or not is_pd:
            raise ConfigError("--kv-link sets the link of simulated PD servers (--backend sim --pd P:D); a real "
                              "server's link is its hardware's")
        if given:
            raise ConfigError(f"--kv-link and --server-arg {given[0]} both set the KV link: give --kv-link only")
        return parse_kv_link(text)
    if backend != "sim" or not is_pd:
        return None
    if given:  # the older way, through --server-arg: recorded as what the simulators were given
        return _from_server_args(server_args)
    return PRESETS[DEFAULT]


def _from_server_args(words: list[str]) -> KvLink:
    """The link `--server-arg "--kv-transfer-bandwidth X --kv-transfer-latency S"` gave the simulators (a flag left
    out: the simulator's default, the tcp preset's figure)."""
    values: dict[str, str] = {}
    for i, word in enumerate(words):
        flag, sep, value = word.partition("=")
        if flag in SIM_FLAGS:
            if not sep and i + 1 >= len(words):
                raise ConfigError(f"--server-arg {flag}: no value follows it")
            values[flag] = value if sep else words[i + 1]
    tcp = PRESETS["tcp"]
    try:
        bw = float(values.get("--kv-transfer-bandwidth", tcp.bandwidth_gib_s))
        lat = float(values.get("--kv-transfer-latency", tcp.latency_s))
    except ValueError:
        raise ConfigError(f"--server-arg: {values}: the KV link's figures must be numbers") from None
    return KvLink("custom", bw, lat, "given: --server-arg " + " ".join(f"{k} {v}" for k, v in values.items()))


def kv_link_of(cfg) -> KvLink | None:  # type: ignore[no-untyped-def]
    """The link of a ReplayConfig's servers (None: not simulated PD servers: the hardware's link)."""
    from tracebench.replay.servers import split_server_args

    backend = "attach" if cfg.attach_prefill else (cfg.backend or "sglang")
    return check_kv_link(cfg.kv_link, backend, cfg.is_pd, split_server_args(cfg.server_args))

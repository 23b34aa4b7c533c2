"""The one door to Ray: imported only by a run given --ray, so that every other command and the replay's hot path
never load it (it is an optional extra)."""

from __future__ import annotations

import socket
from types import ModuleType

from tracebench.errors import ConfigError

RAY_EXTRA = "pip install 'tracebench[ray]'"


def import_ray() -> ModuleType:
    """The ray module, or a one-line ConfigError naming the extra when it is not installed."""
    try:
        import ray
    except ImportError:
        raise ConfigError(f"--ray needs Ray, which is not installed: {RAY_EXTRA}") from None
    return ray


def connect(address: str) -> ModuleType:
    """This process connected to the Ray cluster at `address` (once: a later call with any address reuses the
    connection). A cluster that cannot be reached is bad input (ConfigError), before anything starts."""
    ray = import_ray()
    if ray.is_initialized():
        return ray
    _check_reachable(address)
    try:
        # the actors' and tasks' output stays in the cluster's logs (the servers' logs come back to the run folder)
        ray.init(address=address, log_to_driver=False, logging_level="WARNING", namespace="tracebench")
    except (ConnectionError, ValueError, RuntimeError) as err:
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"--ray {address}: cannot connect to a Ray cluster there ({text})") from None
    return ray


REACH_TIMEOUT_S = 5.0


def _check_reachable(address: str) -> None:
    """A HOST:PORT address must take a TCP connection now: ray.init retries an address where nothing listens for
    minutes. (auto and ray://... are left to ray.init, which refuses them at once when nothing is there.)"""
    host, _, port = address.rpartition(":")
    if address == "auto" or "://" in address or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as err:
        raise ConfigError(f"--ray {address}: no Ray cluster answers there ({err.strerror or err})") from None

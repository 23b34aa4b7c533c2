"""The one door to Ray: imported only by a run given --ray, so that every other command and the replay's hot path
never load it (it is an optional extra)."""

from __future__ import annotations

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
    try:
        # the actors' and tasks' output stays in the cluster's logs (the servers' logs come back to the run folder)
        ray.init(address=address, log_to_driver=False, logging_level="WARNING", namespace="tracebench")
    except (ConnectionError, ValueError, RuntimeError) as err:
        text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"--ray {address}: cannot connect to a Ray cluster there ({text})") from None
    return ray

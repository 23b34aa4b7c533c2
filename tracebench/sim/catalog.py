"""Which timing profile a simulated server runs: by name or file (`--profile`), or by the GPU it stands in for
(`--gpu`, matched against the built-in profiles' `accelerator`). Shared by `tracebench sim-server` and by
`tracebench replay --backend sim` (`--sim-profile` / `--sim-gpu`), which passes the choice on to each server."""

from __future__ import annotations

from tracebench.errors import ConfigError
from tracebench.profiles import DEFAULT_PROFILE, Profile, builtin_profiles, load_profile, profiles_of_gpu


def profile_for_gpu(gpu: str, flag: str = "--gpu") -> Profile:
    """The one built-in profile whose accelerator names `gpu` (tracebench/profiles.py profiles_of_gpu: "H100", "h100
    80gb" and "NVIDIA H100 80GB HBM3" pick llama-2-7b-h100-triton). None or several matching is an error that lists
    the accelerators there are."""
    found = profiles_of_gpu(gpu)
    if len(found) != 1:
        known = "; ".join(f"{p.accelerator} ({p.name})" for p in builtin_profiles())
        which = "no built-in profile" if not found else f"{len(found)} built-in profiles"
        raise ConfigError(f"{flag} {gpu!r}: {which} for this GPU (built-in: {known})")
    return found[0]


def resolve_profile(profile: str | None, gpu: str | None, profile_flag: str = "--profile",
                    gpu_flag: str = "--gpu") -> Profile:
    """`profile` (a name or a JSON file), else the profile of `gpu`, else the default (llama-2-7b-h200-triton)."""
    if profile is not None and gpu is not None:
        raise ConfigError(f"{profile_flag} and {gpu_flag} both choose the timing profile: give one")
    if gpu is not None:
        return profile_for_gpu(gpu, gpu_flag)
    return load_profile(DEFAULT_PROFILE if profile is None else profile)

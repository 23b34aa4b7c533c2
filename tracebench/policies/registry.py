"""Finding a policy by the `--policy` spec: a built-in name, `path/to/file.py:ClassName`, `path/to/file.py`
(the file holds exactly one Policy subclass), or NAME for `policies/NAME.py` (same rule)."""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
import traceback
from pathlib import Path
from types import ModuleType

import numpy as np

from tracebench.errors import PolicyLoadError
from tracebench.policies.base import Policy
from tracebench.policies.cache_aware import CacheAwarePolicy
from tracebench.policies.least_outstanding import LeastOutstandingPolicy
from tracebench.policies.param_aware import ParamAwarePolicy
from tracebench.policies.power_of_two import PowerOfTwoPolicy
from tracebench.policies.prefix_hash import PrefixHashPolicy
from tracebench.policies.random_policy import RandomPolicy
from tracebench.policies.round_robin import RoundRobinPolicy
from tracebench.policies.sjf import ShortestJobFirstPolicy

_BUILTINS: tuple[type[Policy], ...] = (
    RandomPolicy,
    RoundRobinPolicy,
    LeastOutstandingPolicy,
    ShortestJobFirstPolicy,
    PowerOfTwoPolicy,
    ParamAwarePolicy,
    CacheAwarePolicy,
    PrefixHashPolicy,
)


def builtin_policies() -> dict[str, type[Policy]]:
    """Built-in policies by name, in the order `tracebench policies` lists them."""
    return {cls.name: cls for cls in _BUILTINS}


def load_policy(
    spec: str, rng: np.random.Generator, options: dict[str, str], policies_dir: Path = Path("policies")
) -> Policy:
    """The policy named by `spec`, made with `rng` and `options`. Raises PolicyLoadError (exit 2) when it cannot be found or
    loaded, ConfigError (from the policy) for unknown option keys or bad option values."""
    return resolve_policy_class(spec, policies_dir)(rng, options)


def resolve_policy_class(spec: str, policies_dir: Path = Path("policies")) -> type[Policy]:
    """The Policy subclass `spec` names (see the module docstring)."""
    builtins = builtin_policies()
    if not spec:
        raise PolicyLoadError("empty --policy; give a built-in name, path/to/file.py:ClassName, or a policies/ file name")
    if spec.endswith(".py") or ":" in spec:
        path_text, class_name = (spec, "") if spec.endswith(".py") else spec.rpartition(":")[::2]
        if not class_name and not spec.endswith(".py"):
            raise PolicyLoadError(f"--policy {spec!r}: missing the class name after ':' (path/to/file.py:ClassName)")
        path = Path(path_text)
        if not path.is_file():
            raise PolicyLoadError(f"{path}: policy file not found (from --policy {spec!r})")
        module = _import_file(path)
        return _class_by_name(module, path, class_name) if class_name else _only_class(module, path)
    path = policies_dir / f"{spec}.py"
    if spec in builtins:
        if path.is_file():
            raise PolicyLoadError(
                f"--policy {spec!r} is ambiguous: a built-in and {path} share the name; "
                f"rename the file, or name it as {path}:ClassName"
            )
        return builtins[spec]
    if path.is_file():
        return _only_class(_import_file(path), path)
    local = sorted(p.stem for p in policies_dir.glob("*.py")) if policies_dir.is_dir() else []
    raise PolicyLoadError(
        f"unknown policy {spec!r}: not a built-in ({', '.join(builtins)}), and no {path}"
        + (f" (policies there: {', '.join(local)})" if local else "")
        + "; a file elsewhere is named as path/to/file.py:ClassName"
    )


def _import_file(path: Path) -> ModuleType:
    """Import a user's policy file by path. It gets a module name of its own (from its resolved path), so two
    files with the same stem do not collide and nothing is added to sys.path."""
    resolved = path.resolve()
    module_name = f"tracebench_user_policy_{resolved.stem}_{hashlib.sha1(str(resolved).encode()).hexdigest()[:10]}"
    module_spec = importlib.util.spec_from_file_location(module_name, resolved)
    if module_spec is None or module_spec.loader is None:
        raise PolicyLoadError(f"{path}: cannot be imported as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    # registered while it runs: dataclasses and typing look their module up in sys.modules
    sys.modules[module_name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as err:  # the user's code failed: say where, as a PolicyLoadError (the cause stays chained)
        del sys.modules[module_name]
        raise PolicyLoadError(f"{_where(err, resolved, path)}: importing the policy failed: {type(err).__name__}: {err}") from err
    return module


def _where(err: Exception, resolved: Path, shown: Path) -> str:
    """`file:line` of the error inside the user's file, when it happened there."""
    if isinstance(err, SyntaxError) and err.lineno is not None:
        return f"{shown}:{err.lineno}"
    lines = [f.lineno for f in traceback.extract_tb(err.__traceback__) if Path(f.filename) == resolved]
    return f"{shown}:{lines[-1]}" if lines else str(shown)


def _policy_classes(module: ModuleType) -> list[type[Policy]]:
    """Policy subclasses defined in `module` itself (an imported built-in is not counted)."""
    return [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj) and issubclass(obj, Policy) and obj is not Policy and obj.__module__ == module.__name__
    ]


def _only_class(module: ModuleType, path: Path) -> type[Policy]:
    classes = _policy_classes(module)
    if len(classes) != 1:
        found = ", ".join(sorted(c.__name__ for c in classes)) or "none"
        raise PolicyLoadError(
            f"{path}: expected exactly one Policy subclass, found {len(classes)} ({found}); "
            f"name one as {path}:ClassName"
        )
    return _checked(classes[0], path)


def _class_by_name(module: ModuleType, path: Path, class_name: str) -> type[Policy]:
    obj = getattr(module, class_name, None)
    if obj is None:
        found = ", ".join(sorted(c.__name__ for c in _policy_classes(module))) or "none"
        raise PolicyLoadError(f"{path}: no class {class_name!r} (Policy subclasses there: {found})")
    if not (inspect.isclass(obj) and issubclass(obj, Policy)):
        raise PolicyLoadError(f"{path}: {class_name} is not a subclass of tracebench.policies.Policy")
    return _checked(obj, path)


def _checked(cls: type[Policy], path: Path) -> type[Policy]:
    if cls is Policy:
        raise PolicyLoadError(f"{path}: Policy itself is the base class; name your subclass")
    if not cls.name:
        raise PolicyLoadError(f"{path}: {cls.__name__} has no `name` (set name = \"...\"; runs and reports show it)")
    if cls.assign is Policy.assign:
        raise PolicyLoadError(f"{path}: {cls.__name__} does not implement assign(queue, servers)")
    return cls

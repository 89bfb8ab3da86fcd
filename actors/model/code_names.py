"""Code named by configuration: an activation handler or a router's classifier as a
"module:function" path, made from a function and resolved back to one.

Plain Python. A definition carries the path, never the function, so it can be stored, shown and
sent to other processes; the process that runs the code resolves it there. Any client may send a
definition, so a path is honoured only in a module the operator allows: the package's own
handlers and classifiers (BUILTIN_MODULES), and those a broker is started with (its limit
`code_modules`: modules or packages, as a topology broker's `limits` can list them too). Checking
a path against them imports nothing.
"""

from __future__ import annotations

import functools
import importlib
import types
from collections.abc import Sequence
from typing import Any

from actors.errors import InvalidArgument, InvalidDefinition

# modules of the package's own handlers that moved between releases: a queue or router defined by
# an earlier release (in its store, or in a topology file) still resolves
MOVED_MODULES = {"actors.handlers": "actors.activation.handlers"}
# the package's own handlers and classifiers: allowed on every broker
BUILTIN_MODULES = ("actors.activation.handlers", "actors.ddr.classifiers", "actors.ddr.router")


def handler_path(fn: Any) -> str:
    """The "module:function" path of a module-level function; refused for anything else."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    bound = getattr(fn, "__self__", None)
    if bound is not None and not isinstance(bound, (type, types.ModuleType)):
        raise InvalidDefinition(
            f"handler {fn!r} is a bound method; a handler is called without an instance, so "
            "pass a module-level function (or a staticmethod/classmethod)"
        )
    if not module or "<" in qualname or module == "__main__":
        raise InvalidDefinition(
            f"handler {fn!r} is not importable by name (a lambda, a nested function or one "
            "defined in __main__); define it at module level in an importable module"
        )
    return f"{module}:{qualname}"


def _split(path: Any) -> tuple[str, str]:
    """(module, attribute path) of a "module:function" path, the module as it is named now."""
    if not isinstance(path, str) or path.count(":") != 1:
        raise InvalidDefinition(f"handler {path!r} must be 'module:function'")
    module_name, attr = path.split(":")
    module_name = MOVED_MODULES.get(module_name, module_name)
    if not all(part.isidentifier() for part in [*module_name.split("."), *attr.split(".")]):
        raise InvalidDefinition(f"handler {path!r} must be 'module:function' (Python names)")
    return module_name, attr


def check_code_name(path: Any, allowed: Sequence[str]) -> str:
    """The module of a "module:function" path, if it is one the operator allows (BUILTIN_MODULES
    or under one of `allowed`); InvalidDefinition saying what to do otherwise. Imports nothing."""
    module_name, _ = _split(path)
    for root in (*BUILTIN_MODULES, *allowed):
        if module_name == root or module_name.startswith(root + "."):
            return module_name
    raise InvalidDefinition(
        f"handler {path!r} is in module {module_name!r}, which this broker does not allow: "
        "list it (or a package above it) in the broker's code_modules, as "
        f"start_broker(..., limits={{'code_modules': ['{module_name}']}}) or under a topology "
        "broker's limits"
    )


def check_code_modules(value: Any) -> tuple[str, ...]:
    """A broker's `code_modules` limit: module or package names (a list or tuple of them)."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise InvalidArgument(
            f"limit code_modules must be a list of module names, not {type(value).__name__}"
        )
    for name in value:
        if not isinstance(name, str) or not all(p.isidentifier() for p in name.split(".")):
            raise InvalidArgument(f"limit code_modules: {name!r} is not a module name")
    return tuple(value)


def resolve_handler(path: str, allowed: Sequence[str]) -> Any:
    """Import a "module:function" handler from a module the operator allows (check_code_name);
    InvalidDefinition if it is not allowed or does not import."""
    check_code_name(path, allowed)
    return import_code(path)


@functools.lru_cache(maxsize=256)
def import_code(path: str) -> Any:
    """Import a "module:function" path that `check_code_name` has passed where it was defined
    or launched (a reader runs what its broker checked); InvalidDefinition if it does not.
    Resolved once per path (a router's classifier is looked up for every new dialog); a path
    that fails is not remembered, so a module installed later is found."""
    module_name, attr = _split(path)
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except Exception as exc:  # any import-time failure is the definition's problem
        raise InvalidDefinition(
            f"handler {path!r} does not import ({type(exc).__name__}: {exc}); check the module "
            "is installed on every node and the function name is right"
        ) from None
    if not callable(obj):
        raise InvalidDefinition(f"handler {path!r} is not callable")
    return obj

"""Code named by configuration: an activation handler or a router's classifier as a
"module:function" path, made from a function and resolved back to one.

Plain Python. A definition carries the path, never the function, so it can be stored, shown and
sent to other processes; the process that runs the code resolves it there.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

from actors.errors import InvalidDefinition

# modules of the package's own handlers that moved between releases: a queue or router defined by
# an earlier release (in its store, or in a topology file) still resolves
MOVED_MODULES = {"actors.handlers": "actors.activation.handlers"}


def handler_path(fn: Any) -> str:
    """The "module:function" path of a module-level function; refused for anything else."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    bound = getattr(fn, "__self__", None)
    if bound is not None and not isinstance(bound, type | types.ModuleType):
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


def resolve_handler(path: str) -> Any:
    """Import a "module:function" handler; InvalidDefinition if it does not import."""
    if not isinstance(path, str) or path.count(":") != 1:
        raise InvalidDefinition(f"handler {path!r} must be 'module:function'")
    module_name, attr = path.split(":")
    module_name = MOVED_MODULES.get(module_name, module_name)
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

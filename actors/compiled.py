"""Which of the package's modules run compiled.

The install compiles the broker's hot path with Cython (setup.py), each module beside its Python
source. This finder, installed when the package is imported, decides which of the two a module
loads from: in a checkout (an editable install, where sources get edited), the compiled file
unless its source is newer (edited since the last install, or checked out from another commit),
so an edit always takes effect without a rebuild; in an installed wheel, the compiled file (pip
gives every file the time it was written, so there the order of times says nothing). With
`RAYBROKER_PURE=1` every module runs from its source: a profiler sees no lines inside compiled
code.
"""

from __future__ import annotations

import os
import re
import sys
import warnings
from collections.abc import Mapping, Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import EXTENSION_SUFFIXES, ExtensionFileLoader, ModuleSpec, PathFinder
from importlib.util import spec_from_file_location
from types import ModuleType

PURE_ENV = "RAYBROKER_PURE"


class FreshSource(MetaPathFinder):
    """Finds `package`'s submodules as the path would, but runs a compiled module's source
    instead when `pure`, or when `checkout` and the source is newer than it, or when a module
    it was compiled against (a `cimport` in its .pxd: an extension type it extends) runs as
    source, where that type is a plain class."""

    def __init__(self, package: str, pure: bool = False, checkout: bool = True) -> None:
        self.prefix = package + "."
        self.pure = pure
        self.checkout = checkout

    def find_spec(
        self, name: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if not name.startswith(self.prefix):
            return None
        spec = PathFinder.find_spec(name, path)
        if spec is None or not isinstance(spec.loader, ExtensionFileLoader):
            return spec
        built = spec.origin or ""
        source = os.path.join(os.path.dirname(built), name.rpartition(".")[2] + ".py")
        try:
            why = self._stale(name, built)
        except OSError:  # no source beside it: the compiled file is all there is
            return spec
        if why and not self.pure:
            warnings.warn(
                f"{why}: {source} runs as plain Python (slower) until `pip install -e .` "
                "compiles it again",
                RuntimeWarning,
                stacklevel=2,
            )
        if why or self.pure:
            return spec_from_file_location(name, source)
        return spec

    def _stale(self, name: str, built: str) -> str | None:
        """Why module `name`'s compiled file (`built`) must not load, or None: in a checkout,
        its source changed after it was compiled; anywhere, a module of the package it was
        compiled against is not compiled or (in a checkout) is stale itself."""
        folder = os.path.dirname(built)
        source = os.path.join(folder, name.rpartition(".")[2] + ".py")
        if self.checkout and os.stat(source).st_mtime_ns > os.stat(built).st_mtime_ns:
            return f"{source} changed after it was compiled"
        root = folder
        for _ in range(name.count(".")):
            root = os.path.dirname(root)
        for dep in compiled_against(source[: -len(".py")] + ".pxd"):
            if not dep.startswith(self.prefix):
                continue
            dep_built = os.path.join(root, *dep.split(".")) + EXTENSION_SUFFIXES[0]
            if not os.path.exists(dep_built):
                return f"{source} was compiled against {dep}, which is not compiled"
            why = self._stale(dep, dep_built)
            if why:
                return f"{source} was compiled against {dep}, and {why}"
        return None


def compiled_against(pxd: str) -> list[str]:
    """The modules a compiled module's declarations (`pxd`, if there is one) `cimport`."""
    try:
        with open(pxd, encoding="utf-8") as f:
            return _CIMPORT.findall(f.read())
    except OSError:
        return []


_CIMPORT = re.compile(r"^\s*from\s+([\w.]+)\s+cimport\b", re.MULTILINE)


def install(package: str) -> None:
    """Put the finder for `package` (this module's) first on the import path, once."""
    if any(isinstance(f, FreshSource) and f.prefix == package + "." for f in sys.meta_path):
        return
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    checkout = os.path.exists(os.path.join(root, "pyproject.toml"))
    sys.meta_path.insert(0, FreshSource(package, pure_asked(os.environ), checkout))


def pure_asked(environ: Mapping[str, str]) -> bool:
    """Whether `RAYBROKER_PURE=1` asks for every module from source (as RAYBROKER_QUIET=1)."""
    return environ.get(PURE_ENV) == "1"


def running_compiled(package: str) -> list[str]:
    """The modules of `package` imported so far that run compiled."""
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if name.startswith(package + ".")
        and (getattr(module, "__file__", None) or "").endswith(tuple(EXTENSION_SUFFIXES))
    )


install(__package__ or "actors")

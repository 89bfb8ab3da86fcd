"""The build's one step beyond pyproject.toml: the broker's hot path compiled with Cython.

The modules `[tool.raybroker] compiled` names are plain Python and stay so: Cython compiles each
one as it is, beside its source, and the package runs the source instead whenever it is newer
than its compiled file (actors.compiled). Compiled, the broker spends about a fifth less CPU per
message (docs/benchmarks.md). Without a C compiler the build still succeeds and every module runs
as Python; `RAYBROKER_PURE=1` at install compiles nothing.
"""

from __future__ import annotations

import os
import tomllib

from setuptools import Extension, setup

# Python's own semantics everywhere: annotations are documentation here, not C types
DIRECTIVES = {"language_level": 3, "binding": True, "annotation_typing": False}


def extensions() -> list[Extension]:
    if os.environ.get("RAYBROKER_PURE"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:  # the build requires it; a build without isolation may lack it
        return []
    with open("pyproject.toml", "rb") as f:
        names = tomllib.load(f)["tool"]["raybroker"]["compiled"]
    modules = [Extension(name, [name.replace(".", "/") + ".py"], optional=True) for name in names]
    jobs = os.cpu_count() or 1
    return cythonize(modules, compiler_directives=DIRECTIVES, nthreads=jobs, quiet=True)


setup(ext_modules=extensions(), options={"build_ext": {"parallel": os.cpu_count() or 1}})

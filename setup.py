"""The build's one step beyond pyproject.toml: the broker's hot path compiled with Cython.

The modules `[tool.raybroker] compiled` names are plain Python and stay so: Cython compiles each
one as it is, beside its source, and the package runs the source instead whenever it is newer
than its compiled file (actors.compiled). Compiled, the broker spends about a fifth less CPU per
message (docs/benchmarks.md). Without a C compiler the build still succeeds and every module runs
as Python; `RAYBROKER_PURE=1` at install compiles nothing.
"""

from __future__ import annotations

import os
import sys
import tomllib

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# Python's own semantics everywhere: annotations are documentation here, not C types
DIRECTIVES = {"language_level": 3, "binding": True, "annotation_typing": False}
# Python's build flags ask gcc for debug information (-g): for Cython's large C files that is
# about a quarter of the compile (measured: 13.9 -> 10.0 s for one module), and no one debugs
# the generated C. The optimisation level stays Python's (-O3: -O1 compiles in half the time
# but sends ran ~10% slower).
NO_DEBUG_INFO = ["-g0"] if sys.platform != "win32" else []


def extensions() -> list[Extension]:
    if os.environ.get("RAYBROKER_PURE") == "1":  # as actors.compiled.pure_asked
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:  # the build requires it; a build without isolation may lack it
        return []
    with open("pyproject.toml", "rb") as f:
        names = tomllib.load(f)["tool"]["raybroker"]["compiled"]
    modules = [
        Extension(name, [name.replace(".", "/") + ".py"], extra_compile_args=NO_DEBUG_INFO)
        for name in names
    ]
    jobs = os.cpu_count() or 1
    return cythonize(modules, compiler_directives=DIRECTIVES, nthreads=jobs, quiet=True)


class OptionalBuildExt(build_ext):
    """A module that does not compile (no C compiler, no Python headers) runs as Python: the
    build warns and goes on without it. (`Extension(optional=True)` does not do this for an
    editable install, whose copying into the checkout then fails on the missing file.)"""

    def finalize_options(self) -> None:
        super().finalize_options()
        self.parallel = self.parallel or os.cpu_count() or 1  # the modules compile side by side

    def run(self) -> None:
        self.failed: set[str] = set()
        super().run()

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as exc:
            self.warn(f"{ext.name} is not compiled and runs as Python: {exc}")
            self.failed.add(ext.name)

    def copy_extensions_to_source(self) -> None:
        self.extensions = [e for e in self.extensions if e.name not in self.failed]
        super().copy_extensions_to_source()


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})

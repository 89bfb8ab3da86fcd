"""actors.compiled: a compiled module runs compiled unless its source is newer (then the source
runs, with a warning naming it) or RAYBROKER_PURE asks for source everywhere; and the install
that CI makes runs every module pyproject.toml names compiled."""

from __future__ import annotations

import importlib
import os
import sys
import tomllib
import warnings
from importlib.machinery import EXTENSION_SUFFIXES, ExtensionFileLoader
from pathlib import Path

import pytest

from actors.compiled import FreshSource, pure_asked, running_compiled

ROOT = Path(__file__).resolve().parents[2]
COMPILED = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["raybroker"]["compiled"]


def _package(tmp_path: Path, source_age: int) -> tuple[str, Path]:
    """A package `fresh_<n>` with `mod.py` (VALUE = 2) and a compiled file beside it whose mtime
    is `source_age` seconds after the source's (negative: the source is newer). The compiled
    file is not a real one: the tests look at which file the finder picks, never load it."""
    name = f"fresh_{abs(hash(tmp_path)) % 10**8}"
    folder = tmp_path / name
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    source = folder / "mod.py"
    source.write_text("VALUE = 2\n")
    built = folder / f"mod{EXTENSION_SUFFIXES[0]}"
    built.write_bytes(b"not a real extension")
    at = 1_700_000_000
    os.utime(source, (at, at))
    os.utime(built, (at + source_age, at + source_age))
    return name, folder


def test_a_module_compiled_after_its_source_was_written_loads_compiled(tmp_path: Path) -> None:
    name, folder = _package(tmp_path, source_age=60)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = FreshSource(name).find_spec(f"{name}.mod", [str(folder)])
    assert spec is not None and isinstance(spec.loader, ExtensionFileLoader)
    assert spec.origin == str(folder / f"mod{EXTENSION_SUFFIXES[0]}")


def test_a_source_edited_after_the_build_runs_as_source_and_says_so(tmp_path: Path) -> None:
    name, folder = _package(tmp_path, source_age=-60)
    finder = FreshSource(name)
    sys.path.insert(0, str(tmp_path))
    sys.meta_path.insert(0, finder)
    try:
        with pytest.warns(RuntimeWarning, match=r"mod\.py changed after it was compiled"):
            module = importlib.import_module(f"{name}.mod")
        assert module.VALUE == 2  # the edit took effect: the fake compiled file never loaded
        assert module.__file__ == str(folder / "mod.py")
        assert f"{name}.mod" not in running_compiled(name)
    finally:
        sys.meta_path.remove(finder)
        sys.path.remove(str(tmp_path))
        for key in [k for k in sys.modules if k == name or k.startswith(name + ".")]:
            del sys.modules[key]


def test_an_installed_wheel_loads_compiled_whatever_its_files_times(tmp_path: Path) -> None:
    name, folder = _package(tmp_path, source_age=-60)  # pip wrote the source last
    spec = FreshSource(name, checkout=False).find_spec(f"{name}.mod", [str(folder)])
    assert spec is not None and isinstance(spec.loader, ExtensionFileLoader)


def test_pure_runs_the_source_of_an_up_to_date_module_without_a_warning(tmp_path: Path) -> None:
    name, folder = _package(tmp_path, source_age=60)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = FreshSource(name, pure=True).find_spec(f"{name}.mod", [str(folder)])
    assert spec is not None and spec.origin == str(folder / "mod.py")


def test_only_raybroker_pure_1_asks_for_source() -> None:
    assert pure_asked({"RAYBROKER_PURE": "1"})
    assert not pure_asked({"RAYBROKER_PURE": "0"})
    assert not pure_asked({})


def test_modules_of_other_packages_are_left_to_the_rest_of_the_path(tmp_path: Path) -> None:
    name, folder = _package(tmp_path, source_age=-60)
    assert FreshSource("elsewhere").find_spec(f"{name}.mod", [str(folder)]) is None


def test_the_install_runs_every_module_it_names_compiled() -> None:
    """CI installs from a fresh clone (`pip install -e`), so there every module pyproject.toml
    names must load compiled: a build that silently fell back to Python would run the broker
    a fifth slower than docs/benchmarks.md says."""
    for name in COMPILED:
        importlib.import_module(name)
    missing = sorted(set(COMPILED) - set(running_compiled("actors")))
    if missing and not os.environ.get("CI"):
        pytest.skip(f"not compiled here (a pure or stale build): {missing[:3]} ...")
    assert missing == []

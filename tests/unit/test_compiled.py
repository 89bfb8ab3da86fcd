"""actors.compiled: a compiled module runs compiled unless its source is newer (then the source
runs, with a warning naming it) or RAYBROKER_PURE asks for source everywhere; and the install
that CI makes runs every module pyproject.toml names compiled."""

from __future__ import annotations

import ast
import importlib
import os
import re
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
    _module(folder, "mod", "VALUE = 2\n", source_age)
    return name, folder


def _module(folder: Path, stem: str, text: str, source_age: int) -> None:
    """`stem`.py holding `text`, and a compiled file (not a real one) `source_age` seconds
    after it."""
    source = folder / f"{stem}.py"
    source.write_text(text)
    built = folder / f"{stem}{EXTENSION_SUFFIXES[0]}"
    built.write_bytes(b"not a real extension")
    at = 1_700_000_000
    os.utime(source, (at, at))
    os.utime(built, (at + source_age, at + source_age))


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


def _extending(name: str, folder: Path, base_age: int) -> None:
    """Beside `name`'s `mod`: `base.py` and a compiled file `base_age` seconds after it, and
    mod.pxd declaring that mod's classes extend one of base's (a `cimport`)."""
    _module(folder, "base", "class Base:\n    pass\n", base_age)
    (folder / "mod.pxd").write_text(f"from {name}.base cimport Base\n\ncdef class Sub(Base):\n")


def test_a_module_runs_as_source_when_one_it_was_compiled_against_did_change(
    tmp_path: Path,
) -> None:
    """A compiled class that extends a compiled class of another module cannot load once that
    module runs as source (its class is then a plain one): both run as source."""
    name, folder = _package(tmp_path, source_age=60)
    _extending(name, folder, base_age=-60)
    with pytest.warns(RuntimeWarning, match=r"against .*\.base, and .*base\.py changed after"):
        spec = FreshSource(name).find_spec(f"{name}.mod", [str(folder)])
    assert spec is not None and spec.origin == str(folder / "mod.py")


def test_a_module_runs_as_source_when_one_it_was_compiled_against_is_not_compiled(
    tmp_path: Path,
) -> None:
    """A module that failed to compile runs as Python (setup.py goes on without it): those
    compiled against it must too, installed or not."""
    name, folder = _package(tmp_path, source_age=60)
    _extending(name, folder, base_age=60)
    (folder / f"base{EXTENSION_SUFFIXES[0]}").unlink()
    for checkout in (True, False):
        with pytest.warns(RuntimeWarning, match=r"against .*\.base, which is not compiled"):
            spec = FreshSource(name, checkout=checkout).find_spec(f"{name}.mod", [str(folder)])
        assert spec is not None and spec.origin == str(folder / "mod.py")


def test_a_module_compiled_against_an_unchanged_one_loads_compiled(tmp_path: Path) -> None:
    name, folder = _package(tmp_path, source_age=60)
    _extending(name, folder, base_age=60)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = FreshSource(name).find_spec(f"{name}.mod", [str(folder)])
    assert spec is not None and isinstance(spec.loader, ExtensionFileLoader)


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


def _declared(pxd: Path) -> dict[str, tuple[str | None, set[str]]]:
    """A .pxd's extension types: name -> (base, its declared fields)."""
    types: dict[str, tuple[str | None, set[str]]] = {}
    current = None
    for line in pxd.read_text().splitlines():
        head = re.match(r"cdef class (\w+)(?:\((\w+)\))?:", line)
        if head:
            current = head.group(1)
            types[current] = (head.group(2), set())
        elif current and (fields := re.match(r"\s+cdef public object (.+)", line)):
            types[current][1].update(f.strip() for f in fields.group(1).split(","))
    return types


def _assigned(source: Path, cls: str) -> set[str]:
    """The attributes `cls`'s methods in `source` set on `self` (`self.a, self.b = ...` too)."""
    tree = ast.parse(source.read_text())
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls)
    return {
        sub.attr
        for sub in ast.walk(node)
        if isinstance(sub, ast.Attribute)
        and isinstance(sub.ctx, ast.Store)
        and isinstance(sub.value, ast.Name)
        and sub.value.id == "self"
    }


def test_every_attribute_a_compiled_class_sets_is_declared() -> None:
    """A class a .pxd declares compiles as an extension type: it has no __dict__, so an
    attribute its methods set that the .pxd does not declare fails when it runs compiled
    (never as Python). Every .pxd beside a compiled module declares all of them."""
    pxds = sorted((ROOT / "actors").rglob("*.pxd"))
    assert pxds, "no .pxd found"
    types = {}  # class -> (its .pxd, base, own fields)
    for pxd in pxds:
        module = ".".join(pxd.relative_to(ROOT).with_suffix("").parts)
        assert module in COMPILED, f"{pxd} declares types of a module that is not compiled"
        types.update({cls: (pxd, *decl) for cls, decl in _declared(pxd).items()})

    def fields(cls: str | None) -> set[str]:
        return set() if cls is None else types[cls][2] | fields(types[cls][1])

    for cls, (pxd, _, _) in types.items():
        missing = _assigned(pxd.with_suffix(".py"), cls) - fields(cls)
        assert not missing, f"{pxd.name}: {cls} sets {sorted(missing)}, undeclared"

"""Guardrails on the package's shape: where Ray may be imported, which modules import without Ray,
no reaching into other modules' privates, no oversized modules, no import cycles, and every module
in its layer of the layout with its imports pointing down.

The sources are read and parsed with `ast`; nothing is imported except in the subprocess that
checks the pure modules. Each checker takes `{relative posix path: source}` and returns the
violations, so each is also tested on a tiny tree that breaks its rule.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path, PurePosixPath

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("actors", "topologies", "spark_bridge")
MAX_LINES = 500

# The layout, in one place (DESIGN.md section 2, docs/architecture.md): each layer's modules, from
# the ground up. A module imports its own layer and the layers below it, never one above. A name
# covers a module and everything under it; "actors" alone is the public face, actors/__init__.py.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # the handful of helpers every layer uses (and the finder that loads compiled modules); each
    # imports nothing of the project
    ("helpers", ("actors.errors", "actors.ids", "actors.packing", "actors.runs", "actors.counters",
                 "actors.compiled", "actors.collector")),
    # catalog, names, bodies, checks, limits, routes, dialogs; certificates and session keys
    ("model", ("actors.model", "actors.security")),
    ("calls", ("actors.calls",)),  # what a call carries (envelope) and the order of calls
    ("store", ("actors.store", "actors.mirroring")),
    ("transport", ("actors.transport",)),
    ("mechanisms", ("actors.core", "actors.activation", "actors.ddr")),
    ("service", ("actors.service",)),  # the running broker, without Ray
    ("client", ("actors.client",)),  # the handle's verbs, coalescing, call loop, channel, local
    ("remote", ("actors.remote",)),  # the only Ray code of the broker
    ("api", ("actors",)),  # the public face: actors/__init__.py
    ("bridges", ("spark_bridge", "topologies")),
    # the operator's tools: they drive whole clusters, and may import Ray
    ("tools", ("actors.tools", "spark_bridge.bench", "spark_bridge.commands",
               "topologies.commands")),
)  # fmt: skip
# where Ray (and RayDP) may be imported: the broker's Ray code, the tools, the Spark bridge and the
# topology deployer
RAY_ALLOWED = ("actors.remote", "actors.tools", "spark_bridge", "topologies.deploy")

Files = Mapping[str, str]  # relative posix path -> source text


def project_files(root: Path = ROOT) -> dict[str, str]:
    """Every .py file under the project's packages, keyed by its path relative to `root`."""
    found: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            found[path.relative_to(root).as_posix()] = path.read_text(encoding="utf-8")
    return found


def module_name(rel: str) -> str:
    """`actors/core/facade.py` -> `actors.core.facade`; `actors/__init__.py` -> `actors`."""
    parts = list(PurePosixPath(rel).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def by_line(found: list[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    """Violations in file order, then line order (`ast.walk` is breadth-first)."""
    order = {rel: i for i, rel in enumerate(dict.fromkeys(rel for rel, _, _ in found))}
    return sorted(found, key=lambda v: (order[v[0]], v[1]))


def parse(files: Files) -> Iterator[tuple[str, ast.Module]]:
    for rel, text in files.items():
        yield rel, ast.parse(text, filename=rel)


# --- rule 1: Ray only in actors/remote/ (and the RayDP bridge, topology deployers) -------------

RAY_PACKAGES = ("ray", "raydp")


def covers(prefixes: tuple[str, ...], module: str) -> str | None:
    """The longest of `prefixes` that names `module` or a package above it ("actors" only
    itself), or None."""
    found = [p for p in prefixes if module == p or (p != "actors" and module.startswith(p + "."))]
    return max(found, key=len, default=None)


def ray_allowed(rel: str) -> bool:
    return covers(RAY_ALLOWED, module_name(rel)) is not None


def is_ray(module: str | None) -> bool:
    return module is not None and module.split(".")[0] in RAY_PACKAGES


def ray_imports(files: Files) -> list[str]:
    """`file:line: statement` for every Ray/RayDP import, at any depth, outside the allowed
    places (including `importlib.import_module("ray...")` and `__import__("ray...")`)."""
    found: list[tuple[str, int, str]] = []
    for rel, tree in parse(files):
        if ray_allowed(rel):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                hit = any(is_ray(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                hit = node.level == 0 and is_ray(node.module)
            elif isinstance(node, ast.Call):
                hit = (
                    ast.unparse(node.func)
                    in ("importlib.import_module", "import_module", "__import__")
                    and bool(node.args)
                    and isinstance(node.args[0], ast.Constant)
                    and isinstance(node.args[0].value, str)
                    and is_ray(node.args[0].value)
                )
            else:
                hit = False
            if hit:
                found.append((rel, node.lineno, ast.unparse(node)))
    return [f"{rel}:{line}: {code}" for rel, line, code in by_line(found)]


def test_no_module_outside_actors_remote_imports_ray() -> None:
    found = ray_imports(project_files())
    assert not found, "Ray imported outside actors/remote/:\n" + "\n".join(found)


def test_ray_import_check_reports_violations() -> None:
    files = {
        "actors/plain.py": "import os\n\ndef f():\n    from ray.util import queue\n",
        "actors/dyn.py": "import importlib\nimportlib.import_module('raydp')\n",
        "topologies/loader.py": "import raydp.spark as s\n",
        "actors/remote/client.py": "import ray\n",
        "spark_bridge/__init__.py": "import raydp\n",
        "topologies/deploy.py": "from ray import serve\n",
        "actors/tools/verify/faults.py": "import ray\n",
        "actors/remoteish.py": "import ray\n",
    }
    assert ray_imports(files) == [
        "actors/plain.py:4: from ray.util import queue",
        "actors/dyn.py:2: importlib.import_module('raydp')",
        "topologies/loader.py:1: import raydp.spark as s",
        "actors/remoteish.py:1: import ray",
    ]


# --- rule 2: the pure modules import without Ray -----------------------------------------------

PROBE = """
import importlib, json, os, sys, traceback
loaded, failed, via, chain = [], {}, {}, []

class Spy:  # records the project lines on the stack when `ray` is first imported
    def find_spec(self, name, path=None, target=None):
        if name == "ray" and not chain:
            frame = sys._getframe(1)
            while frame is not None:
                where = os.path.relpath(frame.f_code.co_filename)
                if not where.startswith(("..", "<")) and "site-packages" not in where:
                    chain.insert(0, f"{where}:{frame.f_lineno}")
                frame = frame.f_back
        return None

sys.meta_path.insert(0, Spy())
for name in sys.argv[1:]:
    before = "ray" in sys.modules
    try:
        importlib.import_module(name)
    except Exception:
        failed[name] = traceback.format_exc(limit=-3)
    if not before and "ray" in sys.modules:
        loaded.append(name)
        via[name] = chain
print(json.dumps({"loaded": loaded, "via": via, "failed": failed}))
"""


def pure_modules(root: Path = ROOT) -> list[str]:
    """The modules that must import without Ray: all of actors/ but where Ray is allowed, and
    topologies.loader."""
    names = [
        module_name(rel)
        for rel in project_files(root)
        if rel.startswith("actors/") and not ray_allowed(rel)
    ]
    return [*names, "topologies.loader"]


def ray_loaders(modules: list[str], path: Path = ROOT) -> dict:
    """Import `modules` in order in one fresh interpreter (with `path` first on sys.path):
    `loaded` lists the modules after which `ray` appeared in sys.modules, `via` the project lines
    that imported it, `failed` the modules that raised (with their traceback)."""
    out = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.path.insert(0, {str(path)!r})\n{PROBE}", *modules],
        capture_output=True,
        text=True,
        cwd=path,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_pure_modules_import_without_ray() -> None:
    result = ray_loaders(pure_modules())
    assert not result["failed"], "pure modules failed to import:\n" + "\n".join(
        f"{name}:\n{tb}" for name, tb in result["failed"].items()
    )
    assert not result["loaded"], (
        "importing these pulled in ray (the modules after the first are not checked):\n"
        + "\n".join(f"{name} via {' -> '.join(result['via'][name])}" for name in result["loaded"])
    )


def test_pure_module_check_reports_violations(tmp_path: Path) -> None:
    # A stand-in `ray` package, so the check runs without the real one.
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "__init__.py").write_text("")
    (tmp_path / "purepkg").mkdir()
    (tmp_path / "purepkg" / "__init__.py").write_text("")
    (tmp_path / "purepkg" / "clean.py").write_text("import json\n")
    (tmp_path / "purepkg" / "uses.py").write_text("import ray\n")
    (tmp_path / "purepkg" / "broken.py").write_text("raise RuntimeError('boom')\n")
    result = ray_loaders(["purepkg.clean", "purepkg.uses", "purepkg.broken"], tmp_path)
    assert result["loaded"] == ["purepkg.uses"]
    assert result["via"] == {"purepkg.uses": ["purepkg/uses.py:1"]}
    assert list(result["failed"]) == ["purepkg.broken"]


# --- rule 3: no reaching into another module's or object's private members ---------------------

OWN = ("self", "cls")
PRIVATE_OK = {"_replace", "_asdict", "_fields", "_make"}  # the NamedTuple API
# PySpark's JVM DataFrame: the only way to a query's physical plan, which the ingest reads
PRIVATE_OK_IN = {("spark_bridge/arrange.py", "_jdf")}
PRIVATE_OK_ON = {("os", "_exit"), ("sys", "_getframe")}


def is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_access(files: Files) -> list[str]:
    """`file:line: expression` for `obj._name` where obj is not self/cls, and for
    `from X import _name`."""
    found: list[tuple[str, int, str]] = []
    for rel, tree in parse(files):
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and is_private(node.attr):
                owner = node.value.id if isinstance(node.value, ast.Name) else None
                if (
                    owner in OWN
                    or node.attr in PRIVATE_OK
                    or (owner, node.attr) in PRIVATE_OK_ON
                    or (rel, node.attr) in PRIVATE_OK_IN
                ):
                    continue
                found.append((rel, node.lineno, ast.unparse(node)))
            elif isinstance(node, ast.ImportFrom) and any(
                is_private(alias.name) for alias in node.names
            ):
                found.append((rel, node.lineno, ast.unparse(node)))
    return [f"{rel}:{line}: {code}" for rel, line, code in by_line(found)]


def test_no_module_reaches_into_another_modules_privates() -> None:
    found = private_access(project_files())
    assert not found, "private members used from outside:\n" + "\n".join(found)


def test_private_access_check_reports_violations() -> None:
    source = (
        "import os, sys\n"
        "from .core import _helper\n"
        "def f(self, other, p):\n"
        "    self._mine = cls._also = p._replace(a=1)._asdict()\n"
        "    other._theirs.__dict__\n"
        "    os._exit(sys._getframe().f_lineno)\n"
        "    return other.state._rows[0]\n"
    )
    assert private_access({"actors/x.py": source}) == [
        "actors/x.py:2: from .core import _helper",
        "actors/x.py:5: other._theirs",
        "actors/x.py:7: other.state._rows",
    ]


# --- rule 4: small modules ---------------------------------------------------------------------


def oversized(files: Files, limit: int = MAX_LINES) -> list[str]:
    """`file: N lines` for every file over `limit` lines."""
    return [
        f"{rel}: {n} lines" for rel, text in files.items() if (n := len(text.splitlines())) > limit
    ]


def test_no_module_is_over_500_lines() -> None:
    found = oversized(project_files())
    assert not found, f"modules over {MAX_LINES} lines:\n" + "\n".join(found)


def test_size_check_reports_violations() -> None:
    files = {"actors/big.py": "x = 1\n" * (MAX_LINES + 1), "actors/ok.py": "x = 1\n" * MAX_LINES}
    assert oversized(files) == [f"actors/big.py: {MAX_LINES + 1} lines"]


# --- rule 5: no import cycles between the project's modules -----------------------------------


def all_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import at any depth: module or function level, and under `if TYPE_CHECKING:` too
    (a module that needs another's types depends on it as much as one that calls it)."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def imported_modules(
    rel: str, node: ast.Import | ast.ImportFrom, modules: set[str]
) -> Iterator[str]:
    """The project modules one import statement in `rel` imports: `from .x import y` is
    `pkg.x.y` when that is a module, else `pkg.x`."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.name
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name:
                yield name
        return
    base = node.module or ""
    if node.level:
        package = module_name(rel).split(".")
        if not rel.endswith("__init__.py"):
            package.pop()
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(p for p in (*package, node.module) if p)
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        if sub in modules:
            yield sub
        elif base in modules:
            yield base


def import_graph(files: Files) -> dict[str, dict[str, int]]:
    """module -> {imported project module: first line}; no edges out of package `__init__`s
    (a package importing its own submodules is not a cycle)."""
    modules = {module_name(rel) for rel in files}
    graph: dict[str, dict[str, int]] = {name: {} for name in modules}
    for rel, tree in parse(files):
        if rel.endswith("__init__.py"):
            continue
        edges = graph[module_name(rel)]
        for node in all_imports(tree):
            for target in imported_modules(rel, node, modules):
                edges.setdefault(target, node.lineno)
    return graph


def strongly_connected(graph: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """Tarjan's strongly connected components (iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(sorted(component))
    return components


def import_cycles(files: Files) -> list[list[str]]:
    """Each group of modules that import each other (directly or round a loop), sorted."""
    graph = import_graph(files)
    return sorted(
        component
        for component in strongly_connected(graph)
        if len(component) > 1 or component[0] in graph[component[0]]
    )


def describe_cycle(files: Files, component: list[str]) -> str:
    graph = import_graph(files)
    path = {module_name(rel): rel for rel in files}
    edges = [
        f"    {path[a]}:{line} imports {b}"
        for a in component
        for b, line in sorted(graph[a].items())
        if b in component
    ]
    return " <-> ".join(component) + "\n" + "\n".join(edges)


def test_no_import_cycles_between_modules() -> None:
    files = project_files()
    cycles = import_cycles(files)
    assert not cycles, "import cycles:\n" + "\n".join(describe_cycle(files, c) for c in cycles)


def test_cycle_check_reports_violations(tmp_path: Path) -> None:
    tree = {
        "actors/__init__.py": "from .a import A\nfrom .pkg import B\n",
        "actors/a.py": "from . import b\n",
        "actors/b.py": "def f():\n    from .pkg.c import C\n",
        "actors/pkg/__init__.py": "from .c import C\n",
        "actors/pkg/c.py": "import actors.a\n",
        "actors/d.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import e\n",
        "actors/e.py": "from actors import d\n",
        "actors/f.py": "import actors\nfrom actors.f import x\n",
    }
    for rel, text in tree.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    files = project_files(tmp_path)
    assert import_cycles(files) == [
        ["actors.a", "actors.b", "actors.pkg.c"],
        ["actors.d", "actors.e"],  # a cycle through types alone is a cycle
        ["actors.f"],
    ]
    assert "actors/b.py:2 imports actors.pkg.c" in describe_cycle(files, import_cycles(files)[0])


# --- rule 6: every module has its place in the layout, and imports point down its layers -------


def layer_of(module: str) -> int | None:
    """The index in LAYERS of the layer whose names cover `module` most closely, or None."""
    best: tuple[int, int] | None = None  # (length of the covering name, layer)
    for i, (_, names) in enumerate(LAYERS):
        name = covers(names, module)
        if name is not None and (best is None or len(name) > best[0]):
            best = (len(name), i)
    return None if best is None else best[1]


def misplaced(files: Files) -> list[str]:
    """`file: ...` for every module the layout does not place, and `file:line: imports X (layer
    above)` for every import of a module in a higher layer than the importer's."""
    found: list[str] = []
    graph = import_graph(files)
    path = {module_name(rel): rel for rel in files}
    for module in sorted(graph):
        mine = layer_of(module)
        if mine is None:
            found.append(f"{path[module]}: in no layer of the layout (tests/unit/test_layout.py)")
            continue
        for target, line in sorted(graph[module].items(), key=lambda e: e[1]):
            theirs = layer_of(target)
            if theirs is not None and theirs > mine:
                found.append(
                    f"{path[module]}:{line}: imports {target} "
                    f"({LAYERS[theirs][0]} is above {LAYERS[mine][0]})"
                )
    return found


def test_every_import_points_down_the_layers() -> None:
    found = misplaced(project_files())
    assert not found, "the layout is broken:\n" + "\n".join(found)


def test_layer_check_reports_violations() -> None:
    files = {
        "actors/model/catalog.py": "from actors.errors import BrokerError\n",
        "actors/model/bad.py": "def f():\n    from actors.core.state import BrokerState\n",
        "actors/core/state.py": "from actors.model import catalog\n",
        "actors/stray.py": "x = 1\n",
        "actors/errors.py": "class BrokerError(Exception): ...\n",
    }
    assert misplaced(files) == [
        "actors/model/bad.py:2: imports actors.core.state (mechanisms is above model)",
        "actors/stray.py: in no layer of the layout (tests/unit/test_layout.py)",
    ]

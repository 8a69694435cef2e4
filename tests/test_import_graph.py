"""No import cycles among the package's modules.

The graph is read from the source with :mod:`ast` (nothing is imported): one node per module of
``argusdiff``, ``cache``, ``solver``, ``workers``, ``classifiers`` and ``traces``, one edge per
``import``/``from ... import`` of another of those modules. Every import statement counts, wherever
it stands: at the top, inside a function (a lazy import still ties the two modules together) and
under ``if TYPE_CHECKING:`` (a type-only dependency is a dependency a reader has to follow). An
edge goes to the module named: ``from pkg import name`` to ``pkg.name`` when that is a module,
else to ``pkg`` (its ``__init__``). The parent packages that Python initialises on the way
(``a`` and ``a.b`` for ``import a.b.c``) are not edges: every submodule would otherwise form a
cycle with a package ``__init__`` that re-exports it.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("argusdiff", "cache", "solver", "workers", "classifiers", "traces")

Graph = dict[str, dict[str, int]]  # module -> imported module -> line of the first such import


def modules(root: Path, packages: Iterable[str]) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of ``packages`` under ``root``."""
    out: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def import_graph(root: Path, packages: Iterable[str] = PACKAGES) -> Graph:
    """The module import graph of ``packages`` (see the module doc for what counts)."""
    mods = modules(root, packages)
    graph: Graph = {name: {} for name in mods}

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = graph[name]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for target in targets:
                to = resolve(target)
                if to is not None and to != name:
                    edges.setdefault(to, node.lineno)
    return graph


def components(graph: Graph) -> list[list[str]]:
    """The strongly connected components of more than one module (each sorted): the modules that
    import each other, directly or around a circle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return components


def _cycle_in(graph: Graph, component: set[str], start: str) -> list[str]:
    """A shortest cycle through ``start`` inside ``component`` (breadth-first)."""
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in component:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if w not in parent:
                    parent[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover - a component has one


def cycles(graph: Graph) -> list[list[str]]:
    """One shortest cycle (``[a, b, ..., a]``) through the first module of each component."""
    return [_cycle_in(graph, set(c), c[0]) for c in components(graph)]


def describe(graph: Graph, component: list[str]) -> str:
    cycle = _cycle_in(graph, set(component), component[0])
    hops = [f"{a} (line {graph[a][b]}) -> {b}" for a, b in itertools.pairwise(cycle)]
    return f"{len(component)} modules ({', '.join(component)}), e.g.\n    " + "\n    ".join(hops)


def test_the_packages_have_no_import_cycle():
    graph = import_graph(ROOT)
    assert len(graph) > 100 and sum(map(len, graph.values())) > 200  # the whole tree was read
    found = components(graph)
    assert not found, "import cycles (module (line of its import) -> the module it imports):\n  " + "\n  ".join(
        describe(graph, c) for c in found
    )


def test_the_check_finds_cycles_of_every_kind(tmp_path):
    """Top-level, lazy, TYPE_CHECKING and relative imports, and ``from pkg import module``."""
    files = {
        "pkg/__init__.py": "",
        "pkg/a.py": "from pkg.b import f\n",
        "pkg/b.py": "def f():\n    from pkg import c\n",
        "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n",
        "pkg/sub/__init__.py": "from pkg.sub.d import g\n",
        "pkg/sub/d.py": "import pkg.sub.e\n",
        "pkg/sub/e.py": "import os\nfrom .. import a\n",
        "pkg/lone.py": "import pkg.a\nimport numpy\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.sub"] == {"pkg.sub.d": 1}  # a package __init__ that re-exports is no cycle by itself
    assert graph["pkg.sub.e"] == {"pkg.a": 2} and graph["pkg.lone"] == {"pkg.a": 1}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    assert components(graph) == [["pkg.a", "pkg.b", "pkg.c"]]
    assert "pkg.b (line 2) -> pkg.c" in describe(graph, components(graph)[0])
    (tmp_path / "pkg/c.py").write_text("import os\n")
    assert components(import_graph(tmp_path, ["pkg"])) == []


#: what the subsystem packages may import from ``argusdiff`` (docs/architecture.md, "Import
#: direction"): the domain types, errors, settings and profiles, and three standard-library-only
#: leaves (the model-build lock, the micro-batcher, request ids and spans); the package itself for its
#: version
SUBSYSTEM_MAY_IMPORT = {
    "argusdiff",
    "argusdiff.domain",
    "argusdiff.errors",
    "argusdiff.config",
    "argusdiff.profile",
    "argusdiff.loading",
    "argusdiff.batching",
    "argusdiff.tracing",
}


def test_subsystem_packages_import_only_argusdiffs_leaves():
    graph = import_graph(ROOT)
    wrong = sorted(
        f"{mod} imports {dep} (line {line})"
        for mod, deps in graph.items()
        if mod.split(".")[0] in ("cache", "solver", "workers", "classifiers", "traces")
        for dep, line in deps.items()
        if dep.split(".")[0] == "argusdiff" and dep not in SUBSYSTEM_MAY_IMPORT
    )
    assert not wrong, "\n".join(wrong)
    # traces/ reads [traces] through traces.settings' source, which argusdiff.config installs
    assert not [
        (m, d) for m, deps in graph.items() if m.split(".")[0] == "traces" for d in deps if d == "argusdiff.config"
    ]
    # the leaves stay leaves: standard library only (tracing imports OpenTelemetry lazily, when on)
    for leaf in ("argusdiff.loading", "argusdiff.batching", "argusdiff.tracing"):
        assert not graph[leaf], (leaf, graph[leaf])


#: what the transports (``argusdiff.service.transport``) may import from the rest of the service:
#: its errors, the image store and the plan's wire form. The HTTP layer hands down what the
#: transport needs (the idempotent request's enqueue guard: ``transport.guard``), never the reverse
TRANSPORT_MAY_IMPORT = {"argusdiff.service.errors", "argusdiff.service.images", "argusdiff.service.plans"}


def test_the_transport_imports_nothing_above_it():
    graph = import_graph(ROOT)
    wrong = sorted(
        f"{mod} imports {dep} (line {line})"
        for mod, deps in graph.items()
        if mod.startswith("argusdiff.service.transport")
        for dep, line in deps.items()
        if dep.startswith("argusdiff.service")
        and not dep.startswith("argusdiff.service.transport")
        and dep not in TRANSPORT_MAY_IMPORT
    )
    assert not wrong, "\n".join(wrong)
    # and those import nothing of the service themselves
    for leaf in sorted(TRANSPORT_MAY_IMPORT):
        assert not [d for d in graph[leaf] if d.startswith("argusdiff.service")], (leaf, graph[leaf])

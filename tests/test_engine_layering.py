"""The package layering of DESIGN.md: formats <- catalog <- engine <- server <- txlake's clients and CLI.

Reads the ``import`` statements of every module of ``formats/``, ``catalog/``, ``engine/``
(``engine/apis/`` included), ``server/`` and ``txlake/`` with :mod:`ast` -- module-level
ones, those under ``if TYPE_CHECKING:`` and those deferred into a function body alike: a
type-only or deferred import is still a dependency -- and checks

* no import cycle among the engine's modules (the broker and the coordinators it starts
  imported each other until the coordinators wrote through ``engine/partition_writer.py``);
* each layer imports nothing of the layers above it.

Importing a submodule also runs its package's ``__init__``; that implicit edge is left out
(every package would otherwise be in a cycle with its own modules).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: source folder -> the package it is installed as (pyproject.toml's package-dir)
PACKAGES = {"formats": "txlake.formats", "catalog": "txlake.catalog", "engine": "txlake.engine",
            "server": "txlake.server", "txlake": "txlake"}


def _modules() -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the checked folders."""
    found: dict[str, Path] = {}
    for folder, package in PACKAGES.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _imports(name: str, path: Path) -> set[str]:
    """The modules of :data:`MODULES` that ``name`` imports (``from p import m`` names module
    ``p.m`` when there is one, else ``p``)."""
    tree = ast.parse(path.read_text(), str(path))
    package = _package_of(name, path)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                base_name = ".".join(base + ([node.module] if node.module else []))
            else:
                base_name = node.module or ""
            targets = [f"{base_name}.{alias.name}" if f"{base_name}.{alias.name}" in MODULES else base_name
                       for alias in node.names]
        else:
            continue
        for target in targets:
            # ``import a.b.c`` names the deepest of a.b.c, a.b, a that is one of ours
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(name: str) -> str:
    """``formats``, ``catalog``, ``engine``, ``server`` or ``clients`` (the rest of ``txlake``)."""
    for layer in ("formats", "catalog", "engine", "server"):
        if name == f"txlake.{layer}" or name.startswith(f"txlake.{layer}."):
            return layer
    return "clients"


#: layer -> the layers it may import (its own included)
ALLOWED = {
    "formats": {"formats"},
    "catalog": {"formats", "catalog"},
    "engine": {"formats", "catalog", "engine"},
    "server": {"formats", "catalog", "engine", "server"},
    "clients": {"formats", "catalog", "engine", "server", "clients"},
}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
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
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_parser_sees_the_known_edges():
    """The checks below are only as good as the graph: spot-check edges of each import form."""
    assert len([m for m in MODULES if _layer(m) == "engine"]) > 20
    assert "txlake.engine.log_loader" in GRAPH["txlake.engine.broker"]            # from . import log_loader
    assert "txlake.engine.producer_state" in GRAPH["txlake.engine.log_loader"]    # from .producer_state import ...
    assert "txlake.catalog.catalog" in GRAPH["txlake.engine.broker"]              # from txlake.catalog.catalog import
    assert "txlake.engine.errors" in GRAPH["txlake.engine.apis.kafka_apis"]       # from ..errors import
    assert "txlake.engine.apis" in GRAPH["txlake.server.network"]                 # from txlake.engine.apis import
    assert "txlake.formats.records" in GRAPH["txlake.engine.log_cleaner"]         # deferred, inside a function


def test_no_import_cycle_among_engine_modules():
    engine = {m: {t for t in deps if _layer(t) == "engine"} for m, deps in GRAPH.items() if _layer(m) == "engine"}
    cycles = _cycles(engine)
    assert cycles == [], "import cycles among engine modules: " + "; ".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_no_import_of_a_layer_above(layer):
    wrong = sorted(f"{m} imports {t}" for m, deps in GRAPH.items() if _layer(m) == layer
                   for t in deps if _layer(t) not in ALLOWED[layer])
    assert wrong == []


def test_the_broker_is_the_partition_writer_it_hands_out():
    """Every member of :class:`PartitionWriter` (and of the KIP-664 handlers' host) exists on
    :class:`Broker`, so the objects it starts with itself as their writer find what they use."""
    import uuid

    from txlake.catalog.storage import ObjectStore
    from txlake.engine.broker import Broker
    from txlake.engine.partition_writer import PartitionWriter
    from txlake.engine.transaction_admin import TransactionAdminHost

    broker = Broker(ObjectStore(f"memory://layering-{uuid.uuid4().hex}"))
    try:
        assert isinstance(broker, PartitionWriter)
        missing = [m for m in dir(TransactionAdminHost) if not m.startswith("_") and not hasattr(broker, m)]
        assert missing == []
    finally:
        broker.close()

"""Calls only go down: the import graph of the ``mate`` package, read statically (``ast``), has no cycle, names
no adapter package, and every edge between the layers goes down (public API -> custom ops -> dispatch ->
backends -> contract).

Every import counts, at module level or inside a function (a lazy import still couples the two modules), except
those under ``if TYPE_CHECKING:``. Importing ``a.b.c`` also runs the ``__init__`` of ``a.b``: for the cycle
check the importer gets an edge to each package on the way that is not one of its own enclosing packages
(those are already running); the public names ``mate/mamba/__init__.py`` loads on first use count as
its imports. The layer check reads the modules named by the imports themselves.
``importlib.import_module("literal")`` counts as an import of that module.
"""

from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
ADAPTERS = ("mate_vllm", "mate_sglang", "mate_flashinfer_compat")

# Top to bottom; an import may stay in its layer or go to a lower one. Modules not named here (the CLI, the
# benchmarks, the model prewarm, test support, the adapters' helper, the public face of the settings) are tools
# above every layer: nothing layered may import them.
LAYERS = (
    (
        "public API",
        (
            "mate.mamba",
            "mate.mamba.ssu",
            "mate.mamba.ssd",
            "mate.mamba.replay",
            "mate.mamba.planning",
            "mate.mamba.conv1d",
            "mate.mamba.norm",
            "mate.mamba.decode_step",
        ),
    ),
    ("custom ops", ("mate.mamba._ops",)),
    ("dispatch", ("mate.mamba._dispatch",)),
    (
        "backends",
        ("mate.mamba._reference", "mate.mamba._reference.*", "mate.mamba._tilelang", "mate.mamba._tilelang.*"),
    ),
    (
        "contract",
        (
            "mate.mamba._contract",
            "mate.mamba._contract.*",
            "mate.mamba.chunking",
            "mate.mamba._platform",
            "mate.mamba._platform.*",
        ),
    ),
)

# Cycles whose removal belongs to another part of issue 18 (the TileLang launchers' rewrite): each entry must
# still be a cycle, so the entry goes once the cycle does.
PENDING_CYCLES: tuple = ()


# ----------------------------------------------------------------------------------------------- the graph


def modules_of(root: Path, package: str) -> dict[str, Path]:
    """Every module of ``package`` under ``root``: dotted name -> file (a package is its ``__init__.py``)."""
    found = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST):
    """Every import node outside ``if TYPE_CHECKING:`` blocks, and ``importlib.import_module("x")`` calls."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and not node.args[0].value.startswith(".")
        ):
            yield ast.Import(names=[ast.alias(name=node.args[0].value)])
        stack.extend(ast.iter_child_nodes(node))


def _targets(node, module: str, is_package: bool, known: set[str]) -> list[str]:
    """The modules an import node names (the packages on the way to them are added by the caller)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        origin = ".".join(base + ([node.module] if node.module else []))
    else:
        origin = node.module
    # ``from pkg import name`` names pkg.name when that is a module, else pkg (which runs either way)
    subs = [f"{origin}.{a.name}" for a in node.names if f"{origin}.{a.name}" in known]
    return subs + ([origin] if len(subs) < len(node.names) else [])


@dataclass
class Graph:
    """Per module of the package: ``runs`` (the modules an import executes: its target and every package on
    the way), ``names`` (the modules the imports name) and ``outside`` (names outside the package)."""

    runs: dict[str, set[str]] = field(default_factory=dict)
    names: dict[str, set[str]] = field(default_factory=dict)
    outside: dict[str, set[str]] = field(default_factory=dict)


def import_graph(root: Path, package: str) -> Graph:
    mods = modules_of(root, package)
    known = set(mods)
    g = Graph({m: set() for m in mods}, {m: set() for m in mods}, {m: set() for m in mods})
    for module, path in mods.items():
        is_package = path.name == "__init__.py"
        enclosing = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1 + is_package)}
        for node in _imports(ast.parse(path.read_text(), str(path))):
            for target in _targets(node, module, is_package, known):
                if target.split(".")[0] != package:
                    g.outside[module].add(target)
                    continue
                if target in known and target != module:
                    g.names[module].add(target)
                parts = target.split(".")
                for i in range(1, len(parts) + 1):  # the target and every package on the way to it
                    name = ".".join(parts[:i])
                    if name in known and name not in enclosing and name != module:
                        g.runs[module].add(name)
    return g


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan), plus self-loops."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph.get(v, ()):
                found.append(comp)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def layer_of(module: str) -> int | None:
    for rank, (_, members) in enumerate(LAYERS):
        for m in members:
            if module == m or (m.endswith(".*") and module.startswith(m[:-1])):
                return rank
    return None


def upward_edges(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for src, targets in sorted(graph.items()):
        rank = layer_of(src)
        if rank is None:
            continue  # a tool: may import anything of the package
        for dst in sorted(targets):
            to = layer_of(dst)
            if to is None or to < rank:
                what = "a tool" if to is None else f"the {LAYERS[to][0]} layer"
                bad.append(f"{src} ({LAYERS[rank][0]}) imports {dst} ({what})")
    return bad


# ----------------------------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def graph():
    g = import_graph(SRC, "mate")
    # mate/mamba/__init__.py loads the public names on first use (the adapters' start-up hooks import
    # mate.mamba.settings in every interpreter, with no torch): checked as if it imported them eagerly
    from mate.mamba import _PUBLIC

    lazy = {f"mate.mamba.{m}" for m in _PUBLIC.values()}
    g.runs["mate.mamba"] |= lazy
    g.names["mate.mamba"] |= lazy
    return g


def test_the_package_has_no_import_cycle(graph):
    found = cycles(graph.runs)
    pending = [c for c in found if c in PENDING_CYCLES]
    assert [c for c in found if c not in PENDING_CYCLES] == [], "import cycles in mate"
    assert len(pending) == len(PENDING_CYCLES), (
        f"a pending cycle is gone; delete it from PENDING_CYCLES: {[c for c in PENDING_CYCLES if c not in found]}"
    )


def test_no_runtime_module_imports_an_adapter(graph):
    bad = {m: sorted(t for t in ts if t.split(".")[0] in ADAPTERS) for m, ts in graph.outside.items()}
    assert {m: ts for m, ts in bad.items() if ts} == {}


def test_calls_only_go_down(graph):
    assert upward_edges(graph.names) == []
    # the layered modules named above exist (a renamed module must not silently leave the check)
    named = {m for _, members in LAYERS for m in members if not m.endswith(".*")}
    assert named <= set(graph.names), sorted(named - set(graph.names))


def test_the_graph_reads_function_level_imports(graph):
    assert "mate.mamba._tilelang.backend" in graph.names["mate.mamba._dispatch"]  # imported inside backend() only
    # the package on the way to mate.mamba._contract.ssu runs, but is not named
    assert "mate.mamba._contract" in graph.runs["mate.mamba._dispatch"]
    assert "mate.mamba._contract" not in graph.names["mate.mamba._dispatch"]
    assert "mate.mamba" not in graph.runs["mate.mamba._dispatch"]  # an enclosing package: already running


# ------------------------------------------------------------------------------- the check can fail


def test_a_synthetic_cycle_is_found():
    g = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert sorted(map(sorted, cycles(g))) == [["a", "b", "c"], ["e"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))


def test_a_lazy_cycle_through_a_package_init_is_found(tmp_path):
    """``api`` imports ``low`` at module level; ``low`` imports the contract in ``pkg.api_pkg._contract``, whose
    package ``__init__`` imports ``api``: a cycle, though every import but one is inside a function."""
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/api_pkg/__init__.py": "from .api import entry\n",
            "pkg/api_pkg/api.py": "from .. import low\ndef entry():\n    return low.run()\n",
            "pkg/api_pkg/_contract.py": "X = 1\n",
            "pkg/low.py": """
                import typing
                if typing.TYPE_CHECKING:
                    from pkg.tools import helper  # not an import at run time
                def run():
                    from .api_pkg._contract import X
                    return X
            """,
            "pkg/tools.py": "import importlib\nimportlib.import_module('mate_vllm.ops')\nhelper = 1\n",
        },
    )
    g = import_graph(tmp_path, "pkg")
    assert cycles(g.runs) == [{"pkg.api_pkg", "pkg.api_pkg.api", "pkg.low"}]
    assert "pkg.tools" not in g.runs["pkg.low"]
    assert g.outside["pkg.tools"] == {"importlib", "mate_vllm.ops"}
    # the same tree with a lazy package __init__ has no cycle
    (tmp_path / "pkg/api_pkg/__init__.py").write_text("")
    assert cycles(import_graph(tmp_path, "pkg").runs) == []


def test_an_upward_import_is_reported():
    g = {"mate.mamba._dispatch": {"mate.mamba.ssu"}, "mate.mamba.ssu": {"mate.mamba._ops"}, "mate.mamba._ops": set()}
    assert upward_edges(g) == ["mate.mamba._dispatch (dispatch) imports mate.mamba.ssu (the public API layer)"]
    assert upward_edges({"mate.mamba._contract.errors": {"mate.mamba.cli"}}) == [
        "mate.mamba._contract.errors (contract) imports mate.mamba.cli (a tool)"
    ]

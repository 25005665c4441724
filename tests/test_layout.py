"""The package layout holds: layers point one way, broker and gateways never import each other,
no package reaches into another's private names, and no module imports itself back through others.

Every import counts, at module level or inside a function or ``if TYPE_CHECKING:`` block: a cycle
hidden behind a function-level import is still a cycle.

    policies  →  contract  →  broker | gateways  →  proxy  →  valetkey (the tooling)  →  bench
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("policies", "contract", "broker", "gateways", "proxy", "valetkey", "bench")
# the packages each package may import (besides itself)
ALLOWED: dict[str, frozenset[str]] = {
    "policies": frozenset(),
    "contract": frozenset({"policies"}),
    "broker": frozenset({"policies", "contract"}),
    "gateways": frozenset({"policies", "contract"}),
    "proxy": frozenset({"policies", "contract", "gateways"}),
    "valetkey": frozenset({"policies", "contract", "broker", "gateways", "proxy"}),
    "bench": frozenset({"policies", "contract", "broker", "gateways", "proxy", "valetkey"}),
}
MAX_LINES = 420  # "one module per concept, none over ~400 lines"


def modules(root: Path = REPO) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(path: Path, name: str, known: dict[str, Path]) -> Iterator[tuple[str, tuple[str, ...]]]:
    """(imported module, names taken from it) for every import in the file, resolved to a module
    of ours (``from pkg import mod`` resolves to ``pkg.mod``)."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in PACKAGES:
                    yield alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if target.split(".")[0] not in PACKAGES:
                continue
            names = tuple(a.name for a in node.names)
            submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in known]
            if submodules and target in known:
                yield target, ()  # ``from pkg import mod`` runs ``pkg/__init__`` first
            if submodules:
                yield from ((s, ()) for s in submodules)
                rest = tuple(n for n in names if f"{target}.{n}" not in known)
                if rest:
                    yield target, rest
            else:
                yield target, names


def graph(root: Path = REPO) -> dict[str, dict[str, tuple[str, ...]]]:
    known = modules(root)
    edges: dict[str, dict[str, tuple[str, ...]]] = {m: {} for m in known}
    for name, path in known.items():
        for target, names in imports(path, name, known):
            while target not in known and "." in target:
                target = target.rsplit(".", 1)[0]
            if target in known and target != name:
                edges[name][target] = edges[name].get(target, ()) + names
    return edges


def cycles(edges: dict[str, dict[str, tuple[str, ...]]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
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

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_layers_point_one_way() -> None:
    wrong = [
        f"{module} imports {target}"
        for module, targets in graph().items()
        for target in targets
        if target.split(".")[0] != module.split(".")[0]
        and target.split(".")[0] not in ALLOWED[module.split(".")[0]]
    ]
    assert wrong == []


def test_no_private_names_across_packages() -> None:
    wrong = [
        f"{module} takes {name} from {target}"
        for module, targets in graph().items()
        for target, names in targets.items()
        if target.split(".")[0] != module.split(".")[0]
        for name in names
        if name.startswith("_")
    ]
    assert wrong == []


def test_modules_stay_small() -> None:
    large = {name: n for name, path in modules().items()
             if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert large == {}


# The check itself must catch what it is for: a cycle, a forbidden arrow, a private import.
def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    for package in PACKAGES:
        (root / package).mkdir(exist_ok=True)
        (root / package / "__init__.py").touch()


@pytest.mark.parametrize(("files", "expected"), [
    pytest.param({"broker/a.py": "from broker.b import x\n",
                  "broker/b.py": "def f():\n    from broker.a import y\n"},
                 [["broker.a", "broker.b"]], id="function-level-import-cycle"),
    pytest.param({"gateways/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                   "    from gateways.b import B\n",
                  "gateways/b.py": "from gateways import a\n"},
                 [["gateways.a", "gateways.b"]], id="type-checking-cycle"),
    pytest.param({"policies/__init__.py": "from policies.load import load\n",
                  "policies/load.py": "from policies import doc\n", "policies/doc.py": "x = 1\n"},
                 [["policies", "policies.load"]], id="through-a-package-init-that-re-exports"),
    pytest.param({"broker/a.py": "from broker.b import x\n", "broker/b.py": "x = 1\n"},
                 [], id="no-cycle"),
])
def test_cycle_check_finds_cycles(tmp_path: Path, files: dict[str, str],
                                  expected: list[list[str]]) -> None:
    _write(tmp_path, files)
    assert cycles(graph(tmp_path)) == expected


def test_layer_check_finds_forbidden_arrows(tmp_path: Path) -> None:
    _write(tmp_path, {"gateways/a.py": "from broker.b import x\n", "broker/b.py": "x = 1\n",
                      "contract/c.py": "from broker import b\n"})
    edges = graph(tmp_path)
    assert "broker.b" in edges["gateways.a"]
    assert "broker.b" in edges["contract.c"]
    assert "broker" not in ALLOWED["gateways"]
    assert "broker" not in ALLOWED["contract"]

"""The packages point one way: a package imports only packages of a lower layer (or the few same-layer ones named
below), and no import cycle runs between packages or between the modules of one package.

Layers, lowest first:

0. ``precursor.contracts``: messages, settings, formats; imports nothing of ours.
1. ``models.edge``, ``models.training``, ``precursor.store``, ``precursor.simulator``, ``infra``: the domain
   libraries. ``models.training`` builds on ``models.edge``, never the reverse, and ``edge_agent`` imports only
   ``models.edge``. ``simulator`` is one of them on purpose: the edge agent's ``simulated`` source replays a
   simulated fleet as if it were a machine, the way it loads a model.
2. ``edge_agent``, ``pipelines``, ``flows``, ``precursor.api``: the running parts. ``flows`` and ``api`` may read what
   ``pipelines`` writes (its labeling and settings); nothing here imports ``edge_agent``, and ``edge_agent`` imports
   no other running part: the edge install carries none of the cloud.
3. ``precursor``: the command line, on top of everything. The generic names (``contracts``, ``store``, ``simulator``,
   ``api``) live inside it so that they install as ``precursor.*``, not as top-level names that clash with other
   distributions; a package here is the longest listed name a module lies in.

Every import counts, also those inside functions and under ``TYPE_CHECKING``: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

LAYERS: tuple[frozenset[str], ...] = (
    frozenset({"precursor.contracts"}),
    frozenset({"models", "models.edge", "models.training", "precursor.store", "precursor.simulator", "infra"}),
    frozenset({"edge_agent", "pipelines", "flows", "precursor.api"}),
    frozenset({"precursor"}),
)
SAME_LAYER_ALLOWED: frozenset[tuple[str, str]] = frozenset(
    {("flows", "pipelines"), ("precursor.api", "pipelines"), ("models.training", "models.edge")}
)
# Allowed by the layers but not by the edge's install: the edge agent runs models.edge only, never the training side
# (torch, transformers, scikit-learn).
FORBIDDEN: frozenset[tuple[str, str]] = frozenset({("edge_agent", "models.training")})
PACKAGES: frozenset[str] = frozenset().union(*LAYERS)
TOP_LEVEL: frozenset[str] = frozenset(name.split(".")[0] for name in PACKAGES)


def package_of(module: str) -> str:
    """The longest listed package that ``module`` is or lies in: ``precursor.store.db`` is in ``precursor.store``."""
    return max((p for p in PACKAGES if module == p or module.startswith(p + ".")), key=len)


def layer_of(package: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if package in layer)


@dataclass(frozen=True)
class Import:
    """One import of one of our modules: where it is written and which module it names."""

    path: Path
    line: int
    source: str  # the importing module, dotted
    target: str  # the imported module, dotted

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}: {self.source} imports {self.target}"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {
        module_name(path): path
        for package in sorted(TOP_LEVEL)
        for path in sorted((ROOT / package).rglob("*.py"))
        if ".venv" not in path.parts
    }


def resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that ``name`` names or lies in (``from a.b import c`` may name module ``a.b.c``)."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in known:
            return candidate
    return None


def imports_of(module: str, path: Path, known: dict[str, Path]) -> Iterator[Import]:
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                stem = ".".join([*base, node.module] if node.module else base)
            else:
                stem = node.module or ""
            names = [f"{stem}.{alias.name}" for alias in node.names]
        for name in names:
            if name.split(".")[0] not in TOP_LEVEL:
                continue
            target = resolve(name, known)
            if target is not None and target != module:
                yield Import(path, node.lineno, module, target)


def all_imports() -> list[Import]:
    known = modules()
    # One entry per written import: ``from a import b, c`` of one module is one dependency, not two.
    return sorted({imp for module, path in known.items() for imp in imports_of(module, path, known)}, key=str)


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one node (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
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
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def cycle_report(imports: list[Import], key: str) -> list[str]:
    """Each cycle with the imports that close it, so the failure names the files to change."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        a, b = (package_of(imp.source), package_of(imp.target)) if key == "package" else (imp.source, imp.target)
        graph.setdefault(a, set())
        graph.setdefault(b, set())
        if a != b:
            graph[a].add(b)
    report = []
    for component in strongly_connected(graph):
        members = set(component)
        edges = [
            str(imp)
            for imp in imports
            if (package_of(imp.source) if key == "package" else imp.source) in members
            and (package_of(imp.target) if key == "package" else imp.target) in members
            and (key != "package" or package_of(imp.source) != package_of(imp.target))
        ]
        report.append(f"cycle {' <-> '.join(component)}:\n    " + "\n    ".join(edges))
    return report


def upward(imports: list[Import]) -> list[str]:
    wrong = []
    for imp in imports:
        src, dst = package_of(imp.source), package_of(imp.target)
        if src == dst:
            continue
        if (src, dst) in FORBIDDEN:
            wrong.append(f"{imp} ({src} may never import {dst})")
        elif layer_of(dst) > layer_of(src) or (layer_of(dst) == layer_of(src) and (src, dst) not in SAME_LAYER_ALLOWED):
            wrong.append(f"{imp} (layer {layer_of(src)} may not import layer {layer_of(dst)} package {dst})")
    return wrong


def test_every_package_has_a_layer() -> None:
    top = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file() and p.name != "tests"}
    for parent in ("precursor", "models"):
        top |= {f"{parent}.{p.name}" for p in (ROOT / parent).iterdir() if (p / "__init__.py").is_file()}
    assert top == PACKAGES, f"give these packages a layer: {sorted(top - PACKAGES)}; gone: {sorted(PACKAGES - top)}"


def test_no_package_imports_a_higher_or_unlisted_same_layer_package() -> None:
    wrong = upward(all_imports())
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_no_cycle_between_packages() -> None:
    cycles = cycle_report(all_imports(), key="package")
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_cycle_between_modules_of_a_package(package: str) -> None:
    inside = [imp for imp in all_imports() if package_of(imp.source) == package == package_of(imp.target)]
    # A package's __init__ re-exporting its modules is not a cycle of design: leave it out of the graph.
    inside = [imp for imp in inside if imp.source != package and imp.target != package]
    cycles = cycle_report(inside, key="module")
    assert not cycles, "\n".join(cycles)


def test_the_checker_sees_function_level_imports_cycles_and_upward_imports(tmp_path: Path) -> None:
    """The checks themselves can fail: a lazy upward import and a two-module cycle are both reported."""
    source = "def f() -> None:\n    from precursor.cli import app\n"
    known = {"models.a": tmp_path / "a.py", "models.b": tmp_path / "b.py", "precursor.cli": tmp_path / "cli.py"}
    known["models.a"].write_text(source + "from models.b import thing\n")
    known["models.b"].write_text("import models.a\n")
    imports = [imp for m in ("models.a", "models.b") for imp in imports_of(m, known[m], known)]
    assert {(i.source, i.target) for i in imports} == {
        ("models.a", "precursor.cli"),
        ("models.a", "models.b"),
        ("models.b", "models.a"),
    }
    fixed = [Import(ROOT / "x.py", i.line, i.source, i.target) for i in imports]
    assert any("models.a imports precursor.cli" in w for w in upward(fixed))
    assert any("models.a <-> models.b" in c for c in cycle_report(fixed, key="module"))

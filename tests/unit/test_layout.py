"""The shape of the code: no import cycle among the package's modules (imports inside
functions and under ``TYPE_CHECKING`` count: a cycle hidden there is still a cycle), no
module over 500 lines, and no torch for the processes that do without it.

``import-linter`` (``lint-imports``, contracts in pyproject.toml) checks the layers;
this test checks what it cannot: cycles within a layer, sizes, and what a process
really loads at run time.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGES = ("trimtab", "trimtab_tools")
MAX_LINES = 500

# Exceptions, each with its reason. A module listed here that no longer breaks the rule
# fails the test too, so the lists cannot go stale.
KNOWN_LONG: set[str] = {
    # Horovod's DistributedOptimizer contract is one class (the step, synchronize and
    # skip_synchronize, state_dict and its loads, .grad after step); its parts that
    # stand alone already live beside it (pusher, probe, state, meangrad, reports).
    "trimtab.frontend.optimizer",
}
KNOWN_CYCLES: set[frozenset[str]] = set()


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((SRC / package).rglob("*.py")):
            parts = path.relative_to(SRC).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def _imported(name: str, path: Path, modules: dict[str, Path]) -> Iterator[str]:
    """Every module of ours that ``name`` imports, wherever the import statement is."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                package = name.split(".")
                package = package if is_package else package[:-1]
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, *([base] if base else [])])
            # `from a import b` imports the module a.b if there is one, else a's name b.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` where c is a name
                target = target.rpartition(".")[0]
            if target and target != name:
                yield target


def _cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_cycle_and_only_it() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _cycles(graph) == [frozenset({"a", "b", "c"})]


def test_no_import_cycle_among_the_modules() -> None:
    modules = _modules()
    graph = {name: set(_imported(name, path, modules)) for name, path in modules.items()}
    cycles = set(_cycles(graph))
    assert not cycles - KNOWN_CYCLES, f"import cycles: {[sorted(c) for c in cycles]}"
    fixed = KNOWN_CYCLES - cycles
    assert not fixed, f"no longer cycles: remove them from KNOWN_CYCLES: {fixed}"


def test_no_module_over_500_lines() -> None:
    long = {
        name for name, path in _modules().items() if len(path.read_text().splitlines()) > MAX_LINES
    }
    assert not long - KNOWN_LONG, f"over {MAX_LINES} lines: {sorted(long - KNOWN_LONG)}"
    fixed = KNOWN_LONG - long
    assert not fixed, f"no longer too long: remove them from KNOWN_LONG: {sorted(fixed)}"


def test_the_launcher_the_coordinator_and_the_cli_load_no_torch() -> None:
    """What each of these processes imports, run in a fresh interpreter."""
    script = """
import sys
import trimtab
assert trimtab.CoordinatorConfig and trimtab.ConfigError  # lazy names resolve
import trimtab.cli
trimtab.cli.build_parser()  # every subcommand's flags, the tools' included
import trimtab.launch.job, trimtab.launch.train, trimtab.roles.coordinator
print("torch" in sys.modules)
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False", out.stderr


def test_the_public_names_are_exactly_those_of_all() -> None:
    import trimtab

    for name in trimtab.__all__:
        assert getattr(trimtab, name) is not None, name
    assert set(trimtab.__all__) <= set(dir(trimtab))

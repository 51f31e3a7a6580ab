"""The layers of DESIGN.md hold (the import-linter contracts in pyproject.toml), and no
module imports itself through others: an upward import or an import cycle fails the tests."""
from __future__ import annotations

import os
import subprocess
import sys

import grimp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_layer_contracts_are_kept():
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    run = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "0 broken" in run.stdout


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == module:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_imports_itself_through_others():
    assert cycles(grimp.build_graph("cerebro", exclude_type_checking_imports=True)) == []

"""The examples in the docstrings of every module run as written (doctest); a fragment that
needs a live run, a cluster or a server says so and carries ``# doctest: +SKIP``."""
from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import cerebro


def modules_with_examples() -> list[pytest.param]:
    """Each module whose docstrings hold an example; slow where one fits a search (it starts
    worker processes)."""
    found = []
    for module in pkgutil.walk_packages(cerebro.__path__, "cerebro."):
        with open(importlib.util.find_spec(module.name).origin, encoding="utf-8") as f:
            examples = [line for line in f if ">>> " in line or "... " in line]
        if examples:
            fits = any(".fit(" in line and "doctest: +SKIP" not in line for line in examples)
            found.append(pytest.param(module.name, id=module.name, marks=[pytest.mark.slow] if fits else []))
    return found


def test_the_examples_are_found_in_each_layer():
    found = [param.values[0] for param in modules_with_examples()]
    assert len(found) >= 25
    for package in ("cerebro.engine", "cerebro.store", "cerebro.data", "cerebro.worker", "cerebro.search",
                    "cerebro.report", "cerebro.results", "cerebro.serve", "cerebro.backends"):
        assert any(name.startswith(package + ".") for name in found), package


@pytest.mark.parametrize("name", modules_with_examples())
def test_docstring_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)           # an example that writes files writes them here
    outcome = doctest.testmod(importlib.import_module(name), raise_on_error=False, report=True,
                              optionflags=doctest.ELLIPSIS)
    assert outcome.failed == 0, outcome

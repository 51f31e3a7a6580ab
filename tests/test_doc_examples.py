"""The examples in docstrings of pure modules run as written (doctest)."""
from __future__ import annotations

import doctest

import pytest

import cerebro._checks
import cerebro.engine._scheduler
import cerebro.metrics


@pytest.mark.parametrize("module", [cerebro.metrics, cerebro._checks, cerebro.engine._scheduler],
                         ids=lambda module: module.__name__)
def test_docstring_examples_run(module):
    outcome = doctest.testmod(module, raise_on_error=False, report=True)
    assert outcome.attempted > 0 and outcome.failed == 0, outcome

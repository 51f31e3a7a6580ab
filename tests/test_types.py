"""mypy finds nothing in cerebro/, with the configuration in pyproject.toml's [tool.mypy]
(issue 53, point 4): the checks run in the test command, by the mypy the test extra pins."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib

import mypy.version
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_mypy_that_runs_is_the_one_pinned():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    test_extra = project["project"]["optional-dependencies"]["test"]
    pins = [found[1] for requirement in test_extra if (found := re.fullmatch(r"mypy==(.+)", requirement))]
    assert pins == [mypy.version.__version__]
    assert project["tool"]["mypy"]["files"] == ["cerebro"]


@pytest.mark.slow      # about a minute on a fresh clone (no .mypy_cache), seconds after
def test_mypy_finds_nothing_in_cerebro():
    run = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    output = run.stdout + run.stderr
    assert run.returncode == 0 and re.fullmatch(r"Success: no issues found in \d+ source files\n", run.stdout), \
        output[-20000:]

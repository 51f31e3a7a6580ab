"""The ``cerebro`` command run in the test's own process: the same ``entry`` that ``python -m
cerebro`` runs (its exit codes, its one-line errors on stderr), without the 3-6 s a fresh
interpreter spends importing torch. Tests of the process itself (signals, a child that
outlives its parent, the ``-m`` wiring) still start one; see test_demo_and_cli.py."""
from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Done:
    """What the command left: like ``subprocess.CompletedProcess`` with text output."""
    returncode: int
    stdout: str
    stderr: str


def cerebro(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> Done:
    """``cerebro *args`` through ``cerebro.cli.entry``, its output read from ``capsys``."""
    from cerebro.cli import entry
    monkeypatch.setattr(sys, "argv", ["cerebro", *args])
    # entry installs its own one-line warning printer; the test process keeps pytest's.
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    capsys.readouterr()                     # what the test printed before is not the command's
    code = 0
    try:
        entry()
    except SystemExit as exited:
        code = exited.code if isinstance(exited.code, int) else (0 if exited.code is None else 1)
    out, err = capsys.readouterr()
    return Done(code, out, err)

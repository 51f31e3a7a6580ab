"""The small version of ``benchmarks/chaos.py``: a 4-trial ASHA search on 2 local workers
survives one of each fault (worker SIGKILL and SIGSTOP, driver SIGKILL and resume, a torn
journal tail, a flipped checkpoint byte) plus one more, and ends bitwise equal to the same
search undisturbed: history, statuses, decisions, weights, each sub-epoch trained once."""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from chaos import KINDS, chaos  # noqa: E402


@pytest.mark.slow
def test_a_search_survives_every_kind_of_fault_with_the_same_bits(tmp_path):
    report = chaos("local", faults=6, seed=0, quick=True, scratch=str(tmp_path))
    assert report["differences"] == []
    assert set(report["faults"]) == set(KINDS)
    assert report["faults_survived"] >= 6 + 2          # two faults also damaged the run directory
    assert report["drivers"] == 1 + sum(n for kind, n in report["faults"].items() if kind.startswith("driver"))
    assert report["journals_repaired"] >= report["damage"]["torn journal tails"] >= 1
    assert report["workers_lost"] >= report["faults"]["worker SIGKILL"] + report["faults"]["worker SIGSTOP"]

"""``benchmarks/compare.py --quick``: every strategy runs and reports finite numbers (no speed asserted)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_quick_comparison_measures_every_strategy(tmp_path):
    out = tmp_path / "compare.json"
    completed = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "compare.py"), "--quick",
                                "--out", str(out), "--figures", str(tmp_path / "figures")],
                               capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [r["strategy"] for r in report["results"]] == ["task_parallel", "mop", "sequential", "data_parallel",
                                                          "model_averaging"]
    for r in report["results"]:
        for key in ("wall_s", "epoch_s", "peak_rss_mb", "best_val_accuracy"):
            assert math.isfinite(r[key]) and r[key] > 0, (r["strategy"], key, r[key])
        assert r["comm_bytes"] >= 0 and r["data_copies"] >= 1
        assert len(r["curves"]) == 2 and all(len(c) == 2 for c in r["curves"].values())
    by_name = {r["strategy"]: r for r in report["results"]}
    assert by_name["sequential"]["comm_bytes"] == 0
    assert by_name["mop"]["comm_bytes"] > 0 and by_name["data_parallel"]["comm_bytes"] > 0
    assert by_name["task_parallel"]["data_copies"] == 2 and by_name["mop"]["data_copies"] == 1
    for png in report["figures"]:
        assert os.path.getsize(png) > 1000
    assert [g["rule"] for g in report["targets"]] == ["<= 1.05", ">= 100", "> 1", "> 1", "<= 1", "> 0"]
    assert all(math.isfinite(g["measured"]) and isinstance(g["met"], bool) for g in report["targets"])
    assert by_name["task_parallel"]["trial_processes"] >= 1

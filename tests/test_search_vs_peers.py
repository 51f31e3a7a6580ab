"""``benchmarks/search_vs_peers.py`` and its problems: MF-Hartmann has its published optimum
and its bias and noise only raise the value; the LCBench surrogate answers the same every
time and never below its estimated optimum on random configs; every method is charged the same
budget; a missing peer is skipped with its reason; and ``--quick`` (Cerebro's searchers and
Optuna's random search) measures every searcher, each deciding the same on 1 and 4 workers.
No speed or regret is asserted: the numbers are BENCHMARKS.md's."""
from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import _mf_problems as mf  # noqa: E402
import _peers  # noqa: E402
import search_vs_peers as svp  # noqa: E402


@pytest.mark.parametrize("dims, optimum", [(3, -3.86278), (6, -3.32237)])
def test_mf_hartmann_has_its_published_optimum_and_fidelity_only_raises_it(dims, optimum):
    problem = mf.mf_hartmann(dims)
    assert round(problem.optimum, 5) == optimum
    best = dict(zip([p.name for p in problem.params], mf._HARTMANN[dims][2]))
    assert problem.regret(best, problem.max_epochs) == pytest.approx(0.0, abs=1e-5)
    assert problem.observe(best, problem.max_epochs) == problem.truth(best, problem.max_epochs)   # no noise at the end
    rng = np.random.default_rng(0)
    for _ in range(50):
        config = {p.name: float(rng.uniform()) for p in problem.params}
        epoch = int(rng.integers(1, problem.max_epochs))
        assert problem.observe(config, epoch) == problem.observe(config, epoch)      # the same noise every time
        assert problem.observe(config, epoch) >= problem.truth(config, epoch) >= problem.truth(config, 27)
        assert problem.truth(config, 27) >= problem.optimum


def test_the_lcbench_surrogate_is_the_vendored_file_and_answers_the_same_every_time():
    with open(os.path.join(mf.DATA, "model.onnx"), "rb") as f:      # yahpo_data's lcbench/model.onnx
        digest = hashlib.sha256(f.read()).hexdigest()
    assert digest == "b45c0d85ae39abf8820c8bea5ac82f415763afcbaf3b725e36af452b09cb6dcd"
    problem = mf.lcbench(mf.LCBENCH_TASKS[0])
    rng = np.random.default_rng(1)
    unit = rng.uniform(size=(200, len(problem.params)))
    configs = mf._configs(unit)
    errors = mf.lcbench_errors(mf.LCBENCH_TASKS[0], np.repeat(configs, 52, 0), np.tile(np.arange(1, 53), 200))
    assert errors.min() >= problem.optimum and errors.max() <= 100
    config = dict(zip([p.name for p in problem.params], configs[0]))
    assert problem.observe(config, 5) == problem.observe(config, 5) == errors[4]


def test_the_regret_at_a_fraction_is_that_of_the_best_value_seen_by_then():
    steps = [_peers.Step(1, 5.0, 0.5), _peers.Step(3, 2.0, 0.9), _peers.Step(1, 3.0, 0.1), _peers.Step(5, 1.0, 0.2)]
    before, *after = svp.regrets(steps, 10, [0.0, 0.1, 0.3, 0.4, 0.5, 0.9, 1.0])
    assert math.isnan(before)                   # nothing seen yet
    assert after == [0.5, 0.5, 0.9, 0.9, 0.9, 0.2]   # a step counts once all its epochs are spent


@pytest.mark.parametrize("peer", sorted(_peers.PEERS))
def test_every_peer_is_charged_exactly_the_budget(peer):
    if _peers.missing(peer):
        pytest.skip(_peers.missing(peer))
    steps = _peers.run_peer(peer, mf.mf_hartmann(3), 60, 0)
    assert sum(s.cost for s in steps) == 60 and all(s.cost >= 1 for s in steps)


class Recording(_peers.Peer):
    """A peer that stops every trial at epoch 2 but the third, and records what ran when."""

    def __init__(self) -> None:
        self.made, self.live, self.most, self.events = 0, set(), 0, []

    def start(self):
        self.made += 1
        self.live.add(self.made)
        self.most = max(self.most, len(self.live))
        self.events.append(("start", self.made))
        return self.made, {"x0": 0.5, "x1": 0.5, "x2": 0.5}

    def report(self, trial, epoch, value):
        if epoch == 2 and trial % 3:
            self.live.discard(trial)
            self.events.append(("stop", trial))
            return True
        return False

    def end(self, trial, value):
        self.live.discard(trial)
        self.events.append(("end", trial))


@pytest.mark.parametrize("slots", [1, 4])
def test_a_peer_in_flight_runs_that_many_trials_and_starts_one_as_one_ends(slots):
    peer, problem = Recording(), mf.mf_hartmann(3)
    steps = _peers.in_flight(peer, problem, 120, slots)
    assert sum(s.cost for s in steps) == 120 and peer.most == slots
    for i, (kind, trial) in enumerate(peer.events):
        if kind in ("stop", "end") and i + 1 < len(peer.events) and slots == 1:
            assert peer.events[i + 1] == ("start", trial + 1)       # one at a time: the next starts then
    assert ("end", 3) in peer.events and ("stop", 1) in peer.events


def test_a_missing_peer_is_skipped_with_its_reason(monkeypatch):
    monkeypatch.setattr(_peers.importlib.util, "find_spec", lambda name: None if name in ("smac", "dehb") else object())
    peers, skipped = svp.chosen_peers(["smac_hyperband", "dehb", "optuna_random"], quick=True)
    assert peers == ("optuna_random",)
    assert skipped == {"smac_hyperband": "smac is not installed (pip install '.[peers]')",
                       "dehb": "dehb 0.1.2 depends on numpy<2.0 and >=1.18.2; jax 0.10.2 (Cerebro's [keras] and [test] "
                               "extras) depends on numpy>=2.0: ResolutionImpossible; it runs on numpy 2 installed "
                               "with pip install --no-deps dehb==0.1.2 loguru==0.7.3"}


@pytest.mark.slow
def test_the_quick_benchmark_measures_every_searcher_on_the_same_budget(tmp_path):
    out, png = tmp_path / "svp.json", tmp_path / "svp.png"
    completed = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "search_vs_peers.py"), "--quick",
                                "--peers", "optuna_random", "--out", str(out), "--figure", str(png)],
                               capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert completed.returncode == 0, completed.stderr[-3000:]
    report = json.loads(out.read_text())
    kinds = [k for k in svp.CEREBRO if k != "bohb" or hasattr(svp.cb, "BOHB")]
    expected = {f"cerebro_{k}@{w}w" for k in kinds for w in svp.WORKERS} | {"optuna_random"}
    assert [(c["problem"], c["seed"]) for c in report["cells"]] == [("mfh3", 0), ("mfh3", 1),
                                                                     ("lcbench-167190", 0), ("lcbench-167190", 1)]
    for c in report["cells"]:
        assert set(c["methods"]) == expected
        for method, entry in c["methods"].items():
            assert entry["spent"] == report["budgets"][c["problem"]], (c["problem"], method)
            assert all(r >= -1e-9 for r in entry["regret"]) if c["problem"] == "mfh3" else True
            if c["problem"].startswith("lcbench"):        # no noise: the incumbent only gets better
                assert entry["curve"] == sorted(entry["curve"], reverse=True)
    assert report["same_decisions"] == dict.fromkeys(kinds, True)
    goals = report["targets"]
    assert sorted((g["problem"], g["workers"], g["cerebro"], g["fraction"]) for g in goals) == sorted(
        (p, w, f"cerebro_{k}@{w}w", f) for p in ("mfh3", "lcbench-167190") for k in kinds
        for w, fs in ((1, (0.25, 0.5, 1.0)), (4, (0.25,))) for f in fs)     # no peer with 4 in flight
    for p in ("mfh3", "lcbench-167190"):
        for w in svp.WORKERS:
            assert len({g["cerebro"] for g in goals if g["problem"] == p and g["workers"] == w and g["best"]}) == 1
    assert all(g["met"] is None for g in goals if g["cerebro"] == g["against"])     # ASHA against itself
    assert os.path.getsize(png) > 1000

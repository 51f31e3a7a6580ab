"""``cb.simulate``: the engine's decisions on simulated workers and time, with an objective
function in place of training. (That they are a real run's decisions, given the metrics the
real trials reported, is tested in test_adaptive_runs.py for every built-in searcher.)"""
from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest
from _cli import cerebro
from _docs import run_section

import cerebro as cb

SPACE = {"lr": cb.loguniform(1e-4, 1e-1), "width": cb.choice([16, 64, 256]),
         "model": cb.choice([{"kind": "mlp", "depth": cb.randint(1, 4)}, {"kind": "cnn", "drop": cb.uniform(0, 0.5)}])}


def nothing(config):
    """The build of a simulated search: never called."""
    raise AssertionError("cb.simulate built a model")


def curve(config, epoch):
    """A learning curve: lower with epochs, best near lr=1e-2 and width 64, crossing between configs."""
    gap = abs(math.log10(config["lr"]) + 2) + abs(math.log2(config["width"] / 64)) / 4
    depth = config["model"].get("depth", 2)
    return {"val_loss": gap + 1.0 / (epoch * depth), "params": float(config["width"] * depth)}


SEARCHERS = {
    "grid": lambda: cb.GridSearch(nothing, {"lr": cb.choice([1e-3, 1e-2]), "width": cb.choice([16, 64]),
                                            "model": {"kind": "mlp", "depth": cb.choice([1, 3])}}, epochs=4),
    "random": lambda: cb.RandomSearch(nothing, SPACE, num_trials=12, epochs=6, patience=1, min_delta=0.1),
    "asha": lambda: cb.ASHA(nothing, SPACE, num_trials=20, max_epochs=9, grace_period=1, max_concurrent=5),
    "hyperband": lambda: cb.Hyperband(nothing, SPACE, max_epochs=9, eta=3),
    "tpe": lambda: cb.TPESearch(nothing, SPACE, num_trials=14, epochs=4, max_concurrent=3, n_startup_trials=4,
                                grace_period=1, reduction_factor=2),
    "bohb": lambda: cb.BOHB(nothing, SPACE, num_trials=20, max_epochs=9, grace_period=1, max_concurrent=4,
                            n_startup_trials=4),
    "pbt": lambda: cb.PBT(nothing, {"lr": cb.loguniform(1e-4, 1e-1), "width": 64, "model": {"depth": 2}},
                          population=6, epochs=6, perturbation_interval=2),
}


def decisions(result: cb.Result) -> tuple:
    return ([(t.trial_id, t.config, t.status, t.reason, t.epochs, t.best_epoch) for t in result.trials],
            result.history(), result.lineage())


@pytest.mark.parametrize("name", sorted(SEARCHERS))
def test_the_same_decisions_on_1_2_4_and_8_workers(tmp_path, name):
    one, *others = (cb.simulate(SEARCHERS[name](), curve, workers=w, seed=3, store=tmp_path / str(w))
                    for w in (1, 2, 4, 8))
    trials, history, lineage = decisions(one)
    assert len(trials) >= 6 and {s for _, _, s, *_ in trials} <= {"completed", "stopped"}
    for other in others:
        other_trials, other_history, other_lineage = decisions(other)
        assert other_trials == trials
        pd.testing.assert_frame_equal(other_history, history)
        pd.testing.assert_frame_equal(other_lineage, lineage)
    if name in ("asha", "hyperband", "tpe", "random", "bohb"):
        assert any(t.status == "stopped" for t in one.trials)      # something was decided
    if name == "pbt":
        assert len(lineage) > 0


def test_the_seed_alone_decides(tmp_path):
    runs = [cb.simulate(SEARCHERS["tpe"](), curve, workers=2, seed=s, store=tmp_path / f"{s}-{i}")
            for i, s in enumerate((5, 5, 6))]
    assert decisions(runs[0])[0] == decisions(runs[1])[0]
    assert [t.config for t in runs[0].trials] != [t.config for t in runs[2].trials]


def test_more_workers_end_sooner_in_simulated_time_for_the_same_trial_epochs():
    ends = {}
    for workers in (1, 4):
        result = cb.simulate(cb.RandomSearch(nothing, SPACE, num_trials=8, epochs=3), curve, workers=workers)
        schedule = result.schedule()
        assert len(result.history()) == 24 and len(schedule) == 24 * workers      # one sub-epoch per partition
        # No worker runs two sub-epochs at once; no trial is on two workers at once (invariant 1).
        for key in ("worker", "trial_id"):
            for _, rows in schedule.sort_values("start").groupby(key):
                assert (rows.start.to_numpy()[1:] >= rows.end.to_numpy()[:-1]).all()
        ends[workers] = schedule.end.max()
    assert ends[1] == 24.0 and ends[4] == 6.0       # 24 one-second epochs; with 8 trials 4 workers stay busy


def test_epoch_seconds_a_number_or_a_function_of_the_config():
    def search():
        return cb.GridSearch(nothing, {"lr": 1e-2, "width": cb.choice([16, 256]), "model": {}}, epochs=2)
    fixed = cb.simulate(search(), curve, epoch_seconds=2.5)
    assert fixed.schedule().end.max() == 10.0
    sized = cb.simulate(search(), curve, epoch_seconds=lambda config: config["width"] / 16)
    per_trial = sized.schedule().assign(took=lambda s: s.end - s.start).groupby("trial_id").took.sum()
    assert per_trial.to_dict() == {"t0000": 2.0, "t0001": 32.0}


def test_the_anytime_curve_counts_trial_epochs_and_keeps_the_best_so_far():
    result = cb.simulate(SEARCHERS["asha"](), curve, workers=2, seed=1)
    anytime = result.anytime()
    history = result.history()
    assert list(anytime.trial_epochs) == list(range(1, len(history) + 1))
    assert anytime.time.is_monotonic_increasing and anytime.best.is_monotonic_decreasing
    assert anytime.best.iloc[-1] == history.val_loss.min() == result.best.best_metrics["val_loss"]
    assert (anytime.best == anytime.value.cummin()).all()


def test_the_run_directory_reads_as_any_runs(tmp_path, monkeypatch, capsys):
    result = cb.simulate(SEARCHERS["asha"](), curve, workers=2, seed=1, store=tmp_path / "sim")
    loaded = cb.load(tmp_path / "sim")
    assert loaded.finished and decisions(loaded)[0] == decisions(result)[0]
    shown = cerebro(monkeypatch, capsys, "status", str(tmp_path / "sim"))
    assert shown.returncode == 0 and result.best.trial_id in shown.stdout
    info = json.loads((tmp_path / "sim" / "run.json").read_text())
    assert info["simulated"] is True and info["workers"] == 2 and info["searcher"]["class"] == "ASHA"


def test_a_trials_own_fault_ends_that_trial_and_the_search_goes_on():
    def flaky(config, epoch):
        if config["width"] == 16:
            raise ZeroDivisionError("the objective's own bug")
        if config["width"] == 64 and epoch == 2:
            return {"val_loss": float("nan")}
        if config["width"] == 256 and config["lr"] > 1e-2:
            return {"loss": 1.0}
        return curve(config, epoch)
    result = cb.simulate(cb.GridSearch(nothing, {"lr": cb.choice([1e-3, 1e-1]), "width": cb.choice([16, 64, 256]),
                                                 "model": {}}, epochs=3), flaky, seed=0)
    outcome = {(t.config["lr"], t.config["width"]): (t.status, t.epochs) for t in result.trials}
    assert outcome == {(1e-3, 16): ("failed", 0), (1e-1, 16): ("failed", 0), (1e-3, 64): ("diverged", 1),
                       (1e-1, 64): ("diverged", 1), (1e-3, 256): ("completed", 3), (1e-1, 256): ("failed", 0)}
    errors = {t.config["width"]: t.error or t.reason for t in result.trials if t.config["lr"] == 1e-1}
    assert "ZeroDivisionError: the objective's own bug" in errors[16]
    assert errors[64] == "val_loss is nan after epoch 2"
    assert "KeyError: \"the objective returned no 'val_loss' for epoch 1 (it returned ['loss']); the searcher " \
           "ranks trials by it\"" in errors[256]


def test_a_run_in_which_every_trial_failed_says_so():
    result = cb.simulate(cb.RandomSearch(nothing, SPACE, num_trials=3, epochs=2), lambda config, epoch: 7)
    assert result.failure.startswith("every trial of the run failed (3 failed)")
    assert "TypeError: the objective returned int 7 for epoch 1; it must return a dict of metric names to numbers" \
           in result.trials[0].error


@pytest.mark.parametrize("arguments, error, message", [
    ({"searcher": "asha"}, TypeError, "searcher='asha' must be a cerebro.Searcher, such as cb.ASHA(build, space, ...)"),
    ({"objective": None}, TypeError, "objective=None must be a function objective(config, epoch) -> dict of metrics"),
    ({"workers": 0}, ValueError, "workers=0 must be an integer >= 1"),
    ({"seed": -1}, ValueError, "seed=-1 must be a non-negative integer"),
    ({"epoch_seconds": 0}, ValueError, "epoch_seconds=0 must be a positive, finite number of seconds, a function "
                                       "epoch_seconds(config) -> seconds, or None (1 second)"),
    ({"epoch_seconds": math.inf}, ValueError, "epoch_seconds=inf must be a positive, finite number"),
    ({"store": 3}, TypeError, "store=3 must be a path or URL (a str or os.PathLike), not int"),
])
def test_bad_arguments_are_named_before_anything_runs(arguments, error, message):
    given = {"searcher": SEARCHERS["random"](), "objective": curve, **arguments}
    with pytest.raises(error, match=re.escape(message)):
        cb.simulate(given.pop("searcher"), given.pop("objective"), **given)


def test_a_bad_epoch_seconds_answer_is_named():
    with pytest.raises(ValueError, match=re.escape("epoch_seconds({'lr': 0.01, 'width': 16, 'model': {}}) returned "
                                                   "-1; it must return a positive, finite number of seconds")):
        cb.simulate(cb.GridSearch(nothing, {"lr": 1e-2, "width": 16, "model": {}}, epochs=1), curve,
                    epoch_seconds=lambda config: -1)


def test_a_searcher_with_warm_start_is_refused(tmp_path):
    search = cb.RandomSearch(nothing, SPACE, num_trials=2, epochs=1, warm_start=str(tmp_path))
    with pytest.raises(ValueError, match="a simulated run trains nothing, so it has no weights to start from"):
        cb.simulate(search, curve)


def test_a_users_searcher_is_simulated_as_the_engine_would_run_it():
    class Halving(cb.Searcher):
        """Stops every trial whose loss is above the median of the loss reported at its epoch."""

        def start(self, seed):
            self.rng, self.left = np.random.default_rng(seed), 6

        def suggest(self):
            count, self.left = self.left, 0
            return [cb.engine.TrialRequest({"lr": float(self.rng.uniform(1e-3, 1e-1)), "width": 64,
                                            "model": {}}, 4) for _ in range(count)]

        def report(self, trial_id, epoch, metrics):
            return cb.engine.Decision.STOP if metrics["val_loss"] > 1.2 else cb.engine.Decision.CONTINUE

    result = cb.simulate(Halving(nothing, {"lr": cb.uniform(1e-3, 1e-1)}), curve, workers=2, seed=0)
    by_lr = {t.config["lr"]: (t.status, t.epochs) for t in result.trials}
    assert len(by_lr) == 6
    for lr, (status, epochs) in by_lr.items():
        gap = abs(math.log10(lr) + 2)
        assert (status, epochs) == (("stopped", 1) if gap + 0.5 > 1.2 else ("completed", 4))


def test_the_guides_section_runs_as_written(tmp_path, monkeypatch):
    """docs/guide.md § Searching offline: random search and ASHA on one simulated curve."""
    monkeypatch.chdir(tmp_path)
    namespace, printed = run_section("docs/guide.md", "Searching offline", 1)
    random, asha = printed.splitlines()
    assert random.startswith("RandomSearch: 30 trials, 270 trial-epochs, ")      # every trial to its 9 epochs
    spent = int(re.match(r"ASHA: 60 trials, (\d+) trial-epochs, ", asha).group(1))
    assert spent < 270 and spent == len(namespace["result"].history())
    assert float(asha.rsplit(" ", 1)[1]) == round(namespace["result"].best.best_metrics["val_loss"], 3)

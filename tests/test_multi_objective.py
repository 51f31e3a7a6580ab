"""Several objectives (``metric=["val_accuracy", "params"]``, ``mode=["max", "min"]``): checked
before any work, recorded in run.json as lists, searched by grid, random and TPE (Optuna's
multi-objective TPE), refused by the bandits; the first metric ranks; ``result.pareto()`` is
complete and non-dominated; ``cb.metrics.params`` logs a model's parameter count. Where the
front is shown: test_pareto_views.py."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from _models import digits
from _two_objectives import BOTH, SPACE, curve, nothing
from hypothesis import given, settings
from hypothesis import strategies as st

import cerebro as cb
from cerebro._objectives import Objective
from cerebro.engine._epoch_rules import mean_metrics
from cerebro.results._pareto import non_dominated
from cerebro.store._run_info import RunInfoError
from cerebro.worker import Sums


# --- checked before any work -------------------------------------------------------------
@pytest.mark.parametrize("cls", [cb.GridSearch, cb.RandomSearch, cb.TPESearch])
@pytest.mark.parametrize("metric, mode, error, message", [
    ([], [], ValueError, "metric=[] names no metric: give one metric such as 'val_loss', or a non-empty list of them"),
    (["val_loss", "val_loss"], ["min", "min"], ValueError,
     "metric=['val_loss', 'val_loss'] names 'val_loss' twice: each objective must be a different metric"),
    (["val_accuracy", "params"], ["max"], ValueError,
     "mode=['max'] has 1 mode for the 2 metrics of metric=['val_accuracy', 'params']: give one mode per metric, "
     "in the same order"),
    (["val_accuracy", "params"], ["max", "fewest"], ValueError,
     "mode=['max', 'fewest'] holds 'fewest': each mode must be 'min' or 'max'"),
    (["val_accuracy", "params"], "max", ValueError,
     "mode='max' is one mode for metric=['val_accuracy', 'params'], a list: give a list of modes, one per metric, "
     "in the same order (e.g. mode=['max', 'max'])"),
    ("val_loss", ["min"], ValueError,
     "mode=['min'] is a list but metric='val_loss' is one metric: give mode='min' or 'max' for one metric, or as "
     "many metrics as modes in a list"),
    (["val_accuracy", 3], ["max", "min"], TypeError,
     "metric=['val_accuracy', 3] holds 3: each metric must be a non-empty string such as 'val_loss'"),
    ({"val_loss"}, ["min"], TypeError, "metric={'val_loss'} must be a string such as 'val_loss'"),
])
def test_bad_objectives_are_refused_where_the_searcher_is_made_naming_the_value_and_the_rule(cls, metric, mode, error,
                                                                                               message):
    space = {"width": cb.choice([8, 16])}
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        cls(nothing, space, metric=metric, mode=mode)


@pytest.mark.parametrize("cls, why", [
    (cb.ASHA, "it promotes the trials that rank best at each rung on one metric"),
    (cb.BOHB, "it promotes the trials that rank best at each rung on one metric"),
    (cb.Hyperband, "it keeps the trials that rank best in each bracket on one metric"),
    (cb.PBT, "it replaces the trials that rank worst on one metric by the best ones"),
])
def test_the_bandits_refuse_several_objectives_saying_why_and_what_searches_for_a_front(cls, why):
    with pytest.raises(ValueError, match=f"^{cls.__name__} cannot search on several objectives \\(metric="
                                         f"\\['val_accuracy', 'params'\\]\\): {re.escape(why)}; give it one metric, "
                                         f"or search for the Pareto front with cb.RandomSearch, cb.GridSearch or "
                                         f"cb.TPESearch$"):
        cls(nothing, SPACE, **BOTH)


def test_a_users_searcher_refuses_several_objectives_unless_it_says_it_can():
    class Mine(cb.Searcher):
        def suggest(self) -> list:
            return []

    with pytest.raises(ValueError, match="^Mine cannot search on several objectives .*: it does not say how it ranks "
                                         "trials on several metrics; give it one metric"):
        Mine(nothing, SPACE, **BOTH)

    class Fronts(Mine):
        cannot_multi_objective = ""

    assert [tuple(o) for o in Fronts(nothing, SPACE, **BOTH).objectives()] == [("val_accuracy", "max"),
                                                                               ("params", "min")]


def test_tpe_refuses_pruning_on_several_objectives_as_optunas_pruners_do():
    with pytest.raises(ValueError, match=r"^grace_period=1 prunes trials by their rank on one metric, and "
                                         r"metric=\['val_accuracy', 'params'\] has 2: Optuna's pruners refuse "
                                         r"multi-objective studies too; leave grace_period=None to search for the "
                                         r"Pareto front$"):
        cb.TPESearch(nothing, SPACE, grace_period=1, **BOTH)


def test_each_objective_must_be_logged_before_any_worker_starts():
    search = cb.RandomSearch(_build(with_params=False), SPACE, num_trials=2, epochs=1, **BOTH)
    with pytest.raises(ValueError, match=r"^metric='params' is not logged; logged metrics are \['train_loss', "
                                         r"'train_accuracy', 'val_loss', 'val_accuracy'\]; metrics=\{'params': "
                                         r"cb.metrics.params\} logs the parameter count$"):
        search.fit(digits(partitions=1, rows=100), workers=1, verbose=0)


# --- run.json --------------------------------------------------------------------------------
def test_run_json_records_the_lists_and_one_metric_as_before():
    several = cb.RandomSearch(nothing, SPACE, metric=("val_accuracy", "params"), mode=("max", "min"))._settings()
    assert (several["metric"], several["mode"]) == (["val_accuracy", "params"], ["max", "min"])
    one = cb.RandomSearch(nothing, SPACE, metric="val_accuracy", mode="max")._settings()
    assert (one["metric"], one["mode"]) == ("val_accuracy", "max")


def test_a_run_json_with_lists_loads_and_one_whose_lists_do_not_pair_is_damage(tmp_path):
    result = cb.simulate(cb.RandomSearch(nothing, SPACE, num_trials=3, epochs=1, **BOTH), curve,
                         store=tmp_path / "run")
    assert result.objectives == (Objective("val_accuracy", "max"), Objective("params", "min"))
    assert (result.metric, result.mode) == ("val_accuracy", "max")
    path = tmp_path / "run" / "run.json"
    info = json.loads(path.read_text())
    assert info["searcher"]["metric"] == ["val_accuracy", "params"] and info["searcher"]["mode"] == ["max", "min"]
    assert [t.trial_id for t in cb.load(tmp_path / "run").pareto()] == [t.trial_id for t in result.pareto()]
    info["searcher"]["mode"] = ["max"]
    path.write_text(json.dumps(info))
    with pytest.raises(RunInfoError, match=r"run.json is damaged: its searcher's mode=\['max'\] has 1 mode for the 2 "
                                           r"metrics of metric=\['val_accuracy', 'params'\]"):
        cb.load(tmp_path / "run")
    info["searcher"]["mode"] = {"max": 1}
    path.write_text(json.dumps(info))
    with pytest.raises(RunInfoError, match=r"its 'searcher.mode' must be a string or a list of strings, not "):
        cb.load(tmp_path / "run")


# --- searching ---------------------------------------------------------------------------------
def test_multi_objective_tpe_decides_the_same_on_1_and_4_workers_and_tells_every_objective(tmp_path):
    def search():
        return cb.TPESearch(nothing, SPACE, num_trials=16, epochs=2, max_concurrent=3, n_startup_trials=4, **BOTH)

    one, four = (cb.simulate(search(), curve, workers=w, seed=5, store=tmp_path / str(w)) for w in (1, 4))
    assert [(t.trial_id, t.config, t.status) for t in one.trials] == [(t.trial_id, t.config, t.status)
                                                                      for t in four.trials]
    assert one.history().equals(four.history())
    journal = (tmp_path / "1" / "journal.jsonl").read_text()
    told = re.search(r'"trial_id": "t0000", "state": "COMPLETE", "values": (\[[^]]*\])', journal)
    assert told is not None and json.loads(told[1]) == list(curve(one.trials[0].config, 2).values())


def test_a_trial_whose_objective_lacks_a_second_metric_fails_and_the_search_goes_on():
    def patchy(config, epoch):
        metrics = curve(config, epoch)
        return {"val_accuracy": metrics["val_accuracy"]} if config["width"] == 8 else metrics

    result = cb.simulate(cb.RandomSearch(nothing, SPACE, num_trials=12, epochs=2, **BOTH), patchy, seed=1)
    failed = [t for t in result.trials if t.config["width"] == 8]
    assert failed and all(t.status == "failed" and "the objective returned no 'params'" in t.reason for t in failed)
    assert {str(t.status) for t in result.trials if t.config["width"] != 8} == {"completed"}
    assert failed[0].trial_id not in {t.trial_id for t in result.pareto()}


# --- the front ---------------------------------------------------------------------------------
def dominates(a, b, objectives) -> bool:
    """Whether ``a`` is no worse than ``b`` on every objective and better on one."""
    signs = [1 if o.mode == "min" else -1 for o in objectives]
    no_worse = all(s * x <= s * y for s, x, y in zip(signs, a, b))
    return no_worse and any(s * x < s * y for s, x, y in zip(signs, a, b))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4).flatmap(lambda k: st.tuples(
    st.lists(st.sampled_from(["min", "max"]), min_size=k, max_size=k),
    st.lists(st.lists(st.integers(0, 4).map(float), min_size=k, max_size=k), max_size=25))))
def test_the_front_is_non_dominated_and_complete_with_ties_on_it(case):
    modes, points = case
    objectives = [Objective(f"m{i}", mode) for i, mode in enumerate(modes)]
    front = non_dominated(points, objectives)
    assert front == sorted(front)
    for index in front:
        assert not any(dominates(other, points[index], objectives) for other in points)
    for index in set(range(len(points))) - set(front):
        assert any(dominates(points[kept], points[index], objectives) for kept in front)
    for index in front:       # a point equal to one on the front is on it too
        assert {i for i, p in enumerate(points) if p == points[index]} <= set(front)


def test_pareto_is_the_front_of_the_best_epochs_by_the_first_metric_in_its_order_failures_left_out():
    def noisy(config, epoch):   # accuracy peaks at epoch 2, params depend on the epoch: the best epoch counts
        if config["width"] == 128:
            raise RuntimeError("this trial fails")
        metrics = curve(config, min(epoch, 2))
        return {**metrics, "val_accuracy": metrics["val_accuracy"] - 0.1 * (epoch == 3), "params": metrics["params"]
                + epoch}

    result = cb.simulate(cb.RandomSearch(nothing, SPACE, num_trials=24, epochs=3, **BOTH), noisy, seed=2)
    scored = [t for t in result.trials if not t.status.is_failure]
    assert all(t.best_epoch == 2 for t in scored) and len(scored) < len(result.trials)
    points = {t.trial_id: (t.best_metrics["val_accuracy"], t.best_metrics["params"]) for t in scored}
    expected = [t.trial_id for t in result.ranked() if t.trial_id in points
                and not any(dominates(p, points[t.trial_id], result.objectives) for p in points.values())]
    front = result.pareto()
    assert [t.trial_id for t in front] == expected and len(front) >= 2
    assert [t.best_metrics["params"] for t in front] == sorted((t.best_metrics["params"] for t in front), reverse=True)


def test_pareto_of_a_run_with_one_objective_says_to_use_best_and_ranked(tmp_path):
    result = cb.simulate(cb.RandomSearch(nothing, SPACE, num_trials=2, epochs=1, metric="val_accuracy", mode="max"),
                         curve, store=tmp_path / "one")
    with pytest.raises(ValueError, match=f"^the run {re.escape(repr(str(tmp_path / 'one')))} has one objective "
                                         f"\\('val_accuracy', mode='max'\\), so no Pareto front: result.best and "
                                         f"result.ranked\\(\\) give its best trials; pass metric=\\[...\\] and "
                                         f"mode=\\[...\\] to a searcher to search on several$"):
        result.pareto()


# --- params: a metric of the model itself, in a real run ----------------------------------------
def _build(with_params: bool = True):
    def build(config):
        model = torch.nn.Sequential(torch.nn.Linear(64, config["width"]), torch.nn.ReLU(),
                                    torch.nn.Linear(config["width"], 10))
        metrics = {"accuracy": cb.metrics.accuracy, **({"params": cb.metrics.params} if with_params else {})}
        return cb.TorchTrainable(model, torch.optim.Adam(model.parameters(), lr=config["lr"]),
                                 torch.nn.functional.cross_entropy, batch_size=32, metrics=metrics)
    return build


def test_params_is_the_trainable_parameter_count_logged_once_unprefixed_over_partitions():
    trainable = _build()({"lr": 1e-2, "width": 16})
    trainable.model[0].bias.requires_grad_(False)        # not trainable: not counted
    assert trainable.metric_names() == ("accuracy",) and trainable.model_metrics() == {"params": 64 * 16 + 170.0}
    sums = {p: Sums(10 + p, 1.0, {"accuracy": 5.0}, model={"params": 1194.0}) for p in (1, 0, 2)}
    assert mean_metrics("val", sums) == {"val_loss": 3 / 33, "val_accuracy": 15 / 33, "params": 1194.0}
    assert mean_metrics("val", {0: Sums(4, 1.0, {"accuracy": 2.0})}) == {"val_loss": 0.25, "val_accuracy": 0.5}


@pytest.mark.slow
def test_a_real_run_logs_params_each_epoch_and_searches_for_the_front(tmp_path):
    search, data = cb.GridSearch(_build(), {"lr": 3e-2, "width": cb.choice([4, 16, 64])}, epochs=2, **BOTH), \
        digits(partitions=2, rows=300)
    result = search.fit(data, workers=2, store=tmp_path / "run", seed=0, verbose=0)
    history = result.history()
    assert "train_params" not in history and "val_params" not in history
    assert (history.params == 64 * history.width + history.width + 10 * history.width + 10).all()
    assert result.best.trial_id == result.ranked()[0].trial_id == result.pareto()[0].trial_id
    front = result.pareto()
    assert front[-1].config["width"] == 4 and len(front) >= 2
    accuracies = [t.best_metrics["val_accuracy"] for t in front]
    assert accuracies == sorted(accuracies, reverse=True)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["searcher"]["metric"] == ["val_accuracy", "params"]
    assert np.isfinite(history.val_accuracy).all()
    again = search.fit(data, workers=2, store=tmp_path / "run", seed=0, verbose=0, resume=True)   # finished: as is
    assert [t.trial_id for t in again.pareto()] == [t.trial_id for t in front]
    assert again.history().equals(history)

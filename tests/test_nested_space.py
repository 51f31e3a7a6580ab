"""Nested (conditional) spaces: a ``cb.choice`` of dicts that hold primitives. A grid expands
every branch (the product within a branch only); random, ASHA, Hyperband, TPE, BOHB and PBT draw
configs that each fit exactly one branch, the same whatever the timing; PBT keeps a trial in
its branch; a flat space draws as it always did; history() and summary() flatten configs with
dotted names, absent keys missing; runs are the same on 1 and 2 workers."""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
import torch
from _models import digits, make_model
from _search_sim import no_build, outcome, simulate

import cerebro as cb
from cerebro.results import flat_config
from cerebro.search._configs import check_config, grid_values
from cerebro.search._space import Distribution, sample_config

MLP = {"kind": "mlp", "hidden": cb.choice([64, 256]), "penalty": cb.uniform(0, 0.5)}
CNN = {"kind": "cnn", "filters": cb.choice([16, 32]), "layers": cb.randint(2, 5), "penalty": cb.uniform(0.5, 1)}
SPACE = {"lr": cb.loguniform(1e-3, 1e-1), "model": cb.choice([MLP, CNN])}
KEYS = {"mlp": {"kind", "hidden", "penalty"}, "cnn": {"kind", "filters", "layers", "penalty"}}


def objective(config: dict, epoch: int, values: list[float]) -> float:
    return config["model"]["penalty"] + 1.0 / epoch


def in_one_branch(config: dict) -> bool:
    model = config["model"]
    return set(config) == {"lr", "model"} and set(model) == KEYS[model["kind"]] and \
        check_config(SPACE, config) == config


SEARCHERS = {
    "random": lambda: cb.RandomSearch(no_build, SPACE, num_trials=12, epochs=2, metric="val_loss"),
    "asha": lambda: cb.ASHA(no_build, SPACE, num_trials=16, max_epochs=4, grace_period=1, reduction_factor=2),
    "hyperband": lambda: cb.Hyperband(no_build, SPACE, max_epochs=4, eta=2),
    "tpe": lambda: cb.TPESearch(no_build, SPACE, num_trials=16, epochs=2, max_concurrent=4, n_startup_trials=4),
    "bohb": lambda: cb.BOHB(no_build, SPACE, num_trials=24, max_epochs=4, grace_period=1, reduction_factor=2,
                            max_concurrent=4, n_startup_trials=4),
    "pbt": lambda: cb.PBT(no_build, SPACE, population=8, epochs=6, perturbation_interval=2, resample_probability=0.5),
}


@pytest.mark.parametrize("name", sorted(SEARCHERS))
def test_every_searcher_draws_configs_of_one_branch_the_same_whatever_the_timing(name):
    runs = [simulate(SEARCHERS[name](), objective, seed=7, timing_seed=t) for t in range(3)]
    assert all(outcome(run) == outcome(runs[0]) for run in runs[1:])
    configs = [t.config for t in runs[0].values()] + [c for t in runs[0].values() for _, _, c in t.exploits]
    assert all(in_one_branch(config) for config in configs)
    if name != "pbt":     # PBT's population ends where its exploits took it: the better branch
        assert {c["model"]["kind"] for c in configs} == {"mlp", "cnn"}


def test_pbt_explores_inside_the_branch_of_the_trial_it_copies():
    trials = simulate(SEARCHERS["pbt"](), objective, seed=7)
    exploits = [(trials[source].config, config) for t in trials.values() for _, source, config in t.exploits]
    assert exploits
    for before, after in exploits:         # the source's config now, or after its own exploit: same branch
        assert after["model"]["kind"] == before["model"]["kind"]
    assert any(a["model"]["penalty"] != b["model"]["penalty"] or a["lr"] != b["lr"] for b, a in exploits)
    with pytest.raises(ValueError, match=re.escape("mutations: 'model' chooses among dicts (branches of the space); "
                                                   "a trial stays in its branch: name the keys inside it instead")):
        cb.PBT(no_build, SPACE, mutations=["model"])._check()
    cb.PBT(no_build, SPACE, mutations=["model.hidden", "model.layers"])._check()


def test_tpe_asks_optuna_for_each_branchs_own_parameters():
    searcher = SEARCHERS["tpe"]()
    simulate(searcher, objective, seed=7)
    for trial in searcher._study.trials:
        kind = ("mlp", "cnn")[trial.params["model"]]
        inside = {name.split(".", 1)[1] for name in trial.params if name.startswith("model[")}
        assert {name for name in trial.params if name.startswith("model[")} == \
            {f"model[{trial.params['model']}].{key}" for key in inside} and inside == KEYS[kind] - {"kind"}


def test_a_grid_expands_every_branch_with_the_product_within_it_only():
    space = {"lr": cb.choice([1e-3, 1e-2]),
             "model": cb.choice([{"kind": "mlp", "hidden": cb.choice([64, 256])},
                                 {"kind": "cnn", "filters": cb.choice([16, 32]), "layers": cb.choice([2, 3, 4])},
                                 "linear"])}
    grid = grid_values(space, "space")
    assert len(grid) == 2 * (2 + 2 * 3 + 1)
    assert grid[:3] == [{"lr": 1e-3, "model": {"kind": "mlp", "hidden": 64}},
                        {"lr": 1e-3, "model": {"kind": "mlp", "hidden": 256}},
                        {"lr": 1e-3, "model": {"kind": "cnn", "filters": 16, "layers": 2}}]
    assert grid[8] == {"lr": 1e-3, "model": "linear"}
    assert len({repr(c) for c in grid}) == len(grid) and all(check_config(space, c) == c for c in grid)
    with pytest.raises(ValueError, match=re.escape("GridSearch can only enumerate cb.choice values; space['model'] "
                                                   "option 1['layers'] is randint(2, 5)")):
        cb.GridSearch(no_build, {"model": cb.choice([{"a": 1}, {"layers": cb.randint(2, 5)}])})._check()


def test_a_flat_space_draws_as_before_and_nested_dicts_are_spaces_too():
    flat = {"lr": cb.loguniform(1e-4, 1e-1), "batch": cb.choice([32, 64]), "act": "relu", "depth": cb.randint(1, 4)}
    rng, before = np.random.default_rng(3), np.random.default_rng(3)
    for _ in range(20):   # the draws of every run made before nested spaces
        assert sample_config(flat, rng) == {k: v.sample(before) if isinstance(v, Distribution) else v
                                            for k, v in flat.items()}
    optimizer = {"optimizer": {"name": "sgd", "lr": cb.loguniform(1e-3, 1e-1), "momentum": cb.choice([0.0, 0.9])}}
    drawn = sample_config(optimizer, np.random.default_rng(0))
    assert set(drawn["optimizer"]) == {"name", "lr", "momentum"} and drawn["optimizer"]["name"] == "sgd"


def test_a_given_config_must_fit_a_branch():
    good = {"lr": 0.01, "model": {"kind": "cnn", "filters": 16, "layers": 3, "penalty": 0.7}}
    assert check_config(SPACE, good) == good
    mixed = {"lr": 0.01, "model": {"kind": "mlp", "filters": 16, "layers": 3, "penalty": 0.7}}
    with pytest.raises(ValueError, match=re.escape("config['model']={'kind': 'mlp', 'filters': 16, 'layers': 3, "
                                                   "'penalty': 0.7} fits none of the options of choice(")):
        check_config(SPACE, mixed)


def test_history_columns_are_dotted_names_with_absent_keys_missing():
    assert flat_config({"lr": 0.1, "model": {"kind": "cnn", "conv": {"filters": 8}}, "sizes": [1, 2]}) == \
        {"lr": 0.1, "model.kind": "cnn", "model.conv.filters": 8, "sizes": [1, 2]}


def nested_build(config: dict) -> cb.TorchTrainable:
    """The MLP of _models with a width, or its CNN."""
    model_config = config["model"]
    model = make_model(model_config["kind"], model_config.get("hidden", 32))
    return cb.TorchTrainable(model, torch.optim.Adam(model.parameters(), lr=config["lr"]),
                             torch.nn.functional.cross_entropy, batch_size=32,
                             metrics={"accuracy": cb.metrics.accuracy})


@pytest.mark.slow
def test_a_nested_random_search_is_the_same_on_1_and_2_workers_and_flattens_its_history(tmp_path):
    space = {"lr": cb.loguniform(1e-3, 3e-2),
             "model": cb.choice([{"kind": "mlp", "hidden": cb.choice([16, 64])}, {"kind": "cnn"}])}
    search = cb.RandomSearch(nested_build, space, num_trials=6, epochs=2, metric="val_accuracy", mode="max")
    one, two = (search.fit(digits(partitions=4), workers=w, store=tmp_path / str(w), seed=2, verbose=0)
                for w in (1, 2))
    pd.testing.assert_frame_equal(one.history(), two.history(), check_exact=True)
    for a, b in zip(one.trials, two.trials, strict=True):
        assert a.config == b.config and all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    history = one.history()
    assert {"lr", "model.kind", "model.hidden"} <= set(history.columns) and "model" not in history.columns
    cnn = history[history["model.kind"] == "cnn"]
    assert len(cnn) and cnn["model.hidden"].map(lambda v: v is None or math.isnan(v)).all()
    assert set(one.summary()["model.kind"]) == {"mlp", "cnn"}
    assert cb.load(one.run_dir).trials[0].config == one.trials[0].config     # nested, as plain data


def test_the_guides_nested_space_runs_as_written_and_draws_one_branch():
    from _docs import run_section
    space = run_section("docs/guide.md", "Searchers", 1)[0]["space"]
    for seed in range(10):
        config = sample_config(space, np.random.default_rng(seed))
        assert check_config(space, config) == config
        assert set(config["model"]) == {"mlp": {"kind", "hidden"}, "cnn": {"kind", "filters", "layers"}}[
            config["model"]["kind"]] and config["optimizer"]["nesterov"] is False


def _stub_result(space_text: dict, configs: list[dict], values: list[float]):
    """What the report reads of a run: run.json's space, the trials' configs and best metrics."""
    from types import SimpleNamespace
    store = SimpleNamespace(read_run_info=lambda: {"searcher": {"space": space_text}})
    trials = [SimpleNamespace(trial_id=f"t{i:04d}", config=c, best_metrics={"val_loss": v})
              for i, (c, v) in enumerate(zip(configs, values))]
    return SimpleNamespace(store=store, trials=trials, metric="val_loss", mode="min")


def test_the_report_finds_log_uniform_keys_inside_nested_spaces_and_skips_importance_without_variance():
    from cerebro.report._figures import log_keys
    from cerebro.results._importance import importances
    space = {"lr": repr(cb.loguniform(1e-4, 1e-1)), "model": repr(SPACE["model"]), "optimizer": "{'momentum': 0.9}"}
    configs = [{"lr": 1e-3 * (i + 1), "model": {"kind": "mlp", "hidden": 64 * (i % 2 + 1)}, "optimizer": {}}
               for i in range(5)]
    assert log_keys(_stub_result(space, configs, [1.0] * 5)) == {"lr"}
    nested = {"model": "choice([{'kind': 'mlp', 'lr': loguniform(0.0001, 0.1)}, {'kind': 'cnn'}])"}
    branch = [{"model": {"kind": "mlp", "lr": 0.01}}, {"model": {"kind": "cnn"}}]
    assert log_keys(_stub_result(nested, branch, [1.0, 2.0])) == {"model.lr"}
    assert importances(_stub_result(space, configs, [0.5] * 5)) is None           # all equal: nothing to explain

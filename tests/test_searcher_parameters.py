"""Searchers declare their arguments once (``_parameters``: name -> constraint): the
declaration drives the checks (when the constructor returns, and at ``fit``), the settings in
run.json and the ``repr``."""
from __future__ import annotations

import inspect
import json
import math
import os
import pickle
import re
import warnings

import cloudpickle
import numpy as np
import pytest
from _docs import module_of_section
from _models import build, digits

import cerebro as cb
from cerebro import _checks
from cerebro._checks import All, Boolean, Integer, Items, OneOf, Optional, Real, String
from cerebro.engine import TrialRequest

# The built-in searchers and docs/extending.md's worked example: what every searcher passes.
HALVING = module_of_section("docs/extending.md", "A searcher")["SuccessiveHalving"]
SEARCHERS = [cb.GridSearch, cb.RandomSearch, cb.TPESearch, cb.Hyperband, cb.ASHA, cb.BOHB, cb.PBT, HALVING]
SPACE = {"lr": cb.loguniform(1e-4, 1e-1), "hidden": cb.choice([8, 16])}
SHOWN_SPACE = "space={'lr': loguniform(0.0001, 0.1), 'hidden': choice([8, 16])}"
LEGACY_RUN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "legacy_run")


@pytest.mark.parametrize("cls", SEARCHERS)
def test_every_constructor_argument_is_declared_once_in_signature_order(cls):
    arguments = [name for name in inspect.signature(cls.__init__).parameters if name != "self"]
    assert list(cls._declared()) == arguments
    assert all(isinstance(c, _checks.Constraint) for c in cls._declared().values())


@pytest.mark.parametrize("cls", SEARCHERS)
def test_a_subclass_declares_only_its_own_arguments(cls):
    assert set(vars(cls)["_parameters"]).isdisjoint(cb.Searcher._parameters)


@pytest.mark.parametrize("cls", SEARCHERS)
def test_extend_and_add_go_on_or_are_refused_with_the_classs_own_reason(cls):
    """``cannot_extend`` and ``cannot_add`` are the reasons ``extend`` and ``added`` refuse
    with, word for word, or "" where they go on: for the run's epochs, from the space."""
    space, config = ({"hidden": cb.choice([8, 16])}, {"hidden": 8}) if cls is cb.GridSearch else \
        (SPACE, {"lr": 0.01, "hidden": 8})
    search = cls(build, space)
    assert isinstance(cls.cannot_extend, str) and isinstance(cls.cannot_add, str)
    if cls.cannot_extend:
        with pytest.raises(ValueError, match=f"^a {cls.__name__} run cannot be extended: "
                                             f"{re.escape(cls.cannot_extend)}; to train its best trials longer"):
            search.extend(50)
    else:
        search.extend(search.epochs + 2)
        assert search.epochs == 12
    if cls.cannot_add:
        with pytest.raises(ValueError, match=f"^trials cannot be added to a {cls.__name__} run: "
                                             f"{re.escape(cls.cannot_add)}$"):
            search.added(config)
    else:
        assert search.added(config) == TrialRequest(config, search.epochs)


def test_a_new_searcher_is_refused_both_by_default_saying_why():
    class Mine(cb.Searcher):
        def suggest(self) -> list:
            return []

    search = Mine(build, SPACE)
    with pytest.raises(ValueError, match=r"^a Mine run cannot be extended: it does not say whether its decisions "
                                         r"depend on the epoch budget; to train its best trials longer, run "
                                         r"cb.GridSearch over their configs"):
        search.extend(5)
    with pytest.raises(ValueError, match=r"^trials cannot be added to a Mine run: it chooses its trials itself, and "
                                         r"its decisions depend on which it chose$"):
        search.added({"lr": 0.1, "hidden": 8})


@pytest.mark.parametrize("search, shown", [
    (cb.GridSearch(build, {"hidden": cb.choice([8, 16])}),
     "GridSearch(build=build, space={'hidden': choice([8, 16])}, epochs=10, metric='val_loss', mode='min')"),
    (cb.RandomSearch(build, SPACE),
     f"RandomSearch(build=build, {SHOWN_SPACE}, num_trials=10, epochs=10, metric='val_loss', mode='min')"),
    (cb.TPESearch(build, SPACE),
     f"TPESearch(build=build, {SHOWN_SPACE}, num_trials=20, epochs=10, max_concurrent=8, n_startup_trials=10, "
     f"grace_period=None, reduction_factor=3, metric='val_loss', mode='min')"),
    (cb.Hyperband(build, SPACE), f"Hyperband(build=build, {SHOWN_SPACE}, max_epochs=81, eta=3, metric='val_loss', "
                                 f"mode='min')"),
    (cb.ASHA(build, SPACE),
     f"ASHA(build=build, {SHOWN_SPACE}, num_trials=20, max_epochs=27, grace_period=1, reduction_factor=3, "
     f"max_concurrent=16, metric='val_loss', mode='min')"),
    (cb.PBT(build, SPACE),
     f"PBT(build=build, {SHOWN_SPACE}, population=8, epochs=10, perturbation_interval=2, mutations=None, "
     f"quantile_fraction=0.25, resample_probability=0.25, metric='val_loss', mode='min')"),
    (cb.ASHA(lambda config: None, {"lr": 0.1}, num_trials=8, max_epochs=4, reduction_factor=2, mode="max"),
     "ASHA(build=<lambda>, space={'lr': 0.1}, num_trials=8, max_epochs=4, grace_period=1, reduction_factor=2, "
     "max_concurrent=16, metric='val_loss', mode='max')"),
])
def test_repr_is_the_constructor_call(search, shown):
    assert repr(search) == shown


def test_arguments_are_checked_when_the_constructor_returns_and_stored_as_given(tmp_path):
    with pytest.raises(ValueError, match=r"^max_epochs=-5 must be an integer >= 1$"):
        cb.ASHA(build, SPACE, max_epochs=-5, reduction_factor=True)
    with pytest.raises(ValueError, match=r"^mode='maximize' must be 'min' or 'max'$"):
        cb.RandomSearch(build, SPACE, num_trials=4, mode="maximize")
    with pytest.raises(ValueError, match=r"^num_trials=0 must be an integer >= 1$"):
        cb.RandomSearch(build, SPACE, num_trials=0)
    search = cb.ASHA(build, SPACE, max_epochs=np.int64(9))
    assert type(search.max_epochs) is np.int64 and "max_epochs=np.int64(9)" in repr(search)
    search.max_epochs = -5          # set after construction: fit checks again, before any work
    with pytest.raises(ValueError, match=r"^max_epochs=-5 must be an integer >= 1$"):
        search.fit(digits(partitions=None), store=tmp_path / "run", verbose=0)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("searcher, arguments, error, message", [
    (cb.GridSearch, dict(space={"lr": cb.choice([0.1])}, epochs=np.bool_(True)), ValueError,
     "epochs=np.True_ must be an integer >= 1"),
    (cb.RandomSearch, dict(num_trials=4.0), ValueError, "num_trials=4.0 must be an integer >= 1"),
    (cb.TPESearch, dict(n_startup_trials=True), ValueError, "n_startup_trials=True must be an integer >= 0"),
    (cb.TPESearch, dict(grace_period=1.0), ValueError, "grace_period=1.0 must be an integer >= 1"),
    (cb.Hyperband, dict(eta=math.nan), ValueError, "eta=nan must be a number >= 2"),
    (cb.Hyperband, dict(eta="3"), ValueError, "eta='3' must be a number >= 2"),
    (cb.Hyperband, dict(eta=10**400), ValueError, f"eta={'1' + '0' * 199}... (401 characters) must be a number >= 2"),
    (cb.ASHA, dict(max_concurrent=0), ValueError, "max_concurrent=0 must be an integer >= 1"),
    (cb.PBT, dict(population=0), ValueError, "population=0 must be an integer >= 1"),
    (cb.PBT, dict(resample_probability=1.5), ValueError, "resample_probability=1.5 must be in [0, 1]"),
    (cb.PBT, dict(quantile_fraction=0), ValueError, "quantile_fraction=0 must be in (0, 0.5]"),
    (cb.PBT, dict(mutations="lr"), TypeError, "mutations='lr' must be a list of keys of the space"),
    (cb.ASHA, dict(metric=None), TypeError, "metric=None must be a string such as 'val_loss'"),
    (cb.ASHA, dict(mode=True), ValueError, "mode=True must be 'min' or 'max'"),
    (cb.ASHA, dict(build=None), TypeError,
     "build=None must be a function build(config) -> cb.TorchTrainable or cb.KerasTrainable"),
    (cb.ASHA, dict(space={}), ValueError, "space={} must name at least one parameter"),
])
def test_declared_constraints_name_the_argument_and_the_rule(searcher, arguments, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        searcher(**{"build": build, "space": SPACE, **arguments})


def test_the_first_bad_argument_in_signature_order_is_reported():
    with pytest.raises(ValueError, match=r"^max_epochs=0 must be an integer >= 1$"):
        cb.ASHA(build, SPACE, max_epochs=0, reduction_factor=1, mode="x")


@pytest.mark.parametrize("search", [
    cb.GridSearch(build, {"lr": cb.choice([0.1])}, epochs=np.int64(3)),
    cb.TPESearch(build, SPACE, n_startup_trials=np.int32(0), reduction_factor=np.float32(2.5), grace_period=1),
    cb.Hyperband(build, SPACE, max_epochs=np.int64(9), eta=np.int64(3)),
    cb.ASHA(build, SPACE, reduction_factor=np.int64(3), max_concurrent=np.uint8(4)),
    cb.PBT(build, SPACE, population=np.int16(4), quantile_fraction=np.float64(0.5), mutations=("lr",)),
])
def test_numpy_numbers_pass(search):
    search._validate()


def test_hyperband_brackets_of_a_numpy_eta_equal_those_of_a_python_one():
    assert [(b.rung_epochs, b.keep) for b in cb.Hyperband(build, SPACE, max_epochs=np.int64(27),
                                                          eta=np.int64(3)).brackets()] == \
           [(b.rung_epochs, b.keep) for b in cb.Hyperband(build, SPACE, max_epochs=27, eta=3).brackets()]


@pytest.mark.parametrize("search, settings", [
    (cb.GridSearch(build, {"lr": cb.choice([0.1, 0.01])}, epochs=3, metric="val_accuracy", mode="max"),
     {"class": "GridSearch", "metric": "val_accuracy", "mode": "max", "space": {"lr": "choice([0.1, 0.01])"},
      "epochs": 3}),
    (cb.TPESearch(build, SPACE),
     {"class": "TPESearch", "metric": "val_loss", "mode": "min",
      "space": {"lr": "loguniform(0.0001, 0.1)", "hidden": "choice([8, 16])"}, "num_trials": 20, "epochs": 10,
      "max_concurrent": 8, "n_startup_trials": 10, "grace_period": None, "reduction_factor": 3}),
    (cb.PBT(build, {**SPACE, "wd": cb.uniform(0.0, 0.1), "batch_size": 32}),
     {"class": "PBT", "metric": "val_loss", "mode": "min",
      "space": {"lr": "loguniform(0.0001, 0.1)", "hidden": "choice([8, 16])", "wd": "uniform(0.0, 0.1)",
                "batch_size": "32"},
      "population": 8, "epochs": 10, "perturbation_interval": 2, "mutations": ["lr", "wd"],
      "quantile_fraction": 0.25, "resample_probability": 0.25}),
])
def test_run_json_settings_come_from_the_declaration(search, settings):
    assert json.dumps(search._settings()) == json.dumps(settings)       # keys in the same order too


def test_a_searcher_pickled_before_the_declarations_still_loads():
    """``fixtures/legacy_run/searcher.pkl``: an ASHA pickled by the code before this change."""
    with open(os.path.join(LEGACY_RUN, "searcher.pkl"), "rb") as f:
        search = cloudpickle.loads(f.read())
    with open(os.path.join(LEGACY_RUN, "run.json")) as f:
        assert search._settings() == json.load(f)["searcher"]
    assert repr(search) == ("ASHA(build=build, space={'lr': choice([0.03, 0.01, 0.003]), 'hidden': choice([8, 16])}, "
                            "num_trials=8, max_epochs=4, grace_period=1, reduction_factor=2, max_concurrent=4, "
                            "metric='val_loss', mode='min')")
    search._validate()


@pytest.mark.parametrize("dumps, loads", [(pickle.dumps, pickle.loads), (cloudpickle.dumps, cloudpickle.loads)])
def test_a_pickled_searcher_keeps_its_arguments(dumps, loads):
    search = cb.PBT(build, SPACE, population=4, mutations=["lr"])
    assert repr(loads(dumps(search))) == repr(search)


# --- the constraints themselves ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("constraint, good, bad", [
    (Integer(low=1), [1, 7, np.int64(2), np.uint8(1)], [0, True, np.bool_(True), 1.0, "1", None, np.float64(2)]),
    (Integer(low=0, high=3), [0, 3], [-1, 4, False]),
    (Integer(), [-10**30, 0], [0.5, True]),
    (Real(low=2), [2, 2.5, math.inf, np.float32(3), np.int64(2)], [1.99, math.nan, True, "3", None]),
    (Real(low=0, high=0.5, low_open=True), [0.5, 1e-9], [0, 0.51, math.nan]),
    (Real(high=1, high_open=True), [-5, 0.99], [1, 2]),
    (OneOf("min", "max"), ["min", "max"], ["MIN", None, ["min"], True]),
    (OneOf(0, 1), [0, 1, np.int64(1)], [True, False, np.bool_(True), 2]),
    (Boolean(), [True, False, np.bool_(False)], [0, 1, "True", None]),
    (_checks.Callable(), [len, build, int], [None, 1, "build"]),
    (String(), ["val_loss"], [None, 1, b"x"]),
    (Items(), [["a"], ("a",), {"a"}, []], ["a", b"a", None, 3]),
    (Optional(Integer(low=1)), [None, 1], [0, True, "None"]),
    (All(Integer(low=1), Integer(low=2)), [2, 3], [1, 0, True]),
])
def test_constraints_accept_and_refuse(constraint, good, bad):
    assert [constraint.accepts(value) for value in good] == [True] * len(good)
    assert [constraint.accepts(value) for value in bad] == [False] * len(bad)


@pytest.mark.parametrize("constraint, value, error, message", [
    (Integer(low=1), 0, ValueError, "x=0 must be an integer >= 1"),
    (Integer(low=1), True, ValueError, "x=True must be an integer >= 1"),
    (Integer(low=0, high=3), 4, ValueError, "x=4 must be an integer in [0, 3]"),
    (Integer(), "1", ValueError, "x='1' must be an integer"),
    (Real(low=2), 1.5, ValueError, "x=1.5 must be a number >= 2"),
    (Real(low=0, low_open=True), 0, ValueError, "x=0 must be a number > 0"),
    (Real(high=1, high_open=True), 1, ValueError, "x=1 must be a number < 1"),
    (Real(), None, ValueError, "x=None must be a number"),
    (Real(low=0, high=0.5, low_open=True), 0.75, ValueError, "x=0.75 must be in (0, 0.5]"),
    (Real(low=0, high=1, high_open=True), 1, ValueError, "x=1 must be in [0, 1)"),
    (OneOf("min", "max"), "up", ValueError, "x='up' must be 'min' or 'max'"),
    (OneOf("a", "b", "c"), "d", ValueError, "x='d' must be 'a', 'b' or 'c'"),
    (OneOf(1), 2, ValueError, "x=2 must be 1"),
    (Boolean(), 1, TypeError, "x=1 must be True or False"),
    (_checks.Callable(), 3, TypeError, "x=3 must be callable"),
    (String(), 3, TypeError, "x=3 must be a string"),
    (Items(), "ab", TypeError, "x='ab' must be a collection of items, not a string"),
    (Optional(Integer(low=1)), 0, ValueError, "x=0 must be an integer >= 1"),
    (All(Integer(low=1), Integer(low=2, description="at least 2: a pair")), 1, ValueError,
     "x=1 must be at least 2: a pair"),
    (All(Integer(low=1), Integer(low=2, description="at least 2: a pair")), 0, ValueError,
     "x=0 must be an integer >= 1"),
    (Integer(low=1, description="a count of trials"), 0, ValueError, "x=0 must be a count of trials"),
])
def test_constraint_messages_name_the_value_and_the_rule(constraint, value, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        constraint.check("x", value)


def test_a_constraint_shows_its_rule():
    assert repr(Optional(Integer(low=1))) == "<Optional: an integer >= 1 or None>"
    assert repr(All(Integer(low=1), Real(high=9))) == "<All: an integer >= 1 and a number <= 9>"


@pytest.mark.parametrize("metric, mode, said", [
    ("val_accuracy", "min", "metric='val_accuracy' is ranked with mode='min', so result.best is the trial with the "
                            "lowest val_accuracy; pass mode='max' for the highest"),
    ("train_f1", "min", "metric='train_f1' is ranked with mode='min', so result.best is the trial with the lowest "
                        "train_f1; pass mode='max' for the highest"),
    ("val_loss", "max", "metric='val_loss' is ranked with mode='max', so result.best is the trial with the highest "
                        "val_loss; pass mode='min' for the lowest"),
    ("val_accuracy", "max", None), ("val_loss", "min", None), ("val_score", "min", None), ("val_score", "max", None),
])
def test_a_mode_that_ranks_the_worst_trial_first_is_warned_of_where_the_searcher_is_made(metric, mode, said):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cb.GridSearch(build, {"lr": cb.choice([0.1])}, epochs=1, metric=metric, mode=mode)
    assert [(str(w.message), os.path.basename(w.filename)) for w in caught] == \
        ([] if said is None else [(said, "test_searcher_parameters.py")])


def test_fits_keywords_reach_the_engine_as_one_frozen_run_options(monkeypatch):
    """``Searcher.fit``'s keywords (the users' contract) are built into one ``RunOptions`` at
    the front door, each one carried, none dropped; the engine's ``Limits`` holds the limits."""
    import dataclasses

    from cerebro import _fit
    from cerebro.engine._settings import Limits, RunOptions
    seen = []
    monkeypatch.setattr(_fit, "fit", lambda searcher, data, options: seen.append((searcher, data, options)))
    search, data = cb.GridSearch(build, {"lr": cb.choice([0.1])}, epochs=1), digits()
    search.fit(data, workers=3, store="runs/x", seed=7, verbose=0, trial_timeout=5.0, max_failures=2,
               max_trial_losses=4, keep_checkpoints=1, time_budget=60.0, tensorboard=False, mlflow="sqlite:///m.db",
               hang_after=None, metrics_port=0, metrics_host="0.0.0.0", resume=True)
    [(searcher, given, options)] = seen
    assert searcher is search and given is data
    assert options == RunOptions("local", 3, "runs/x", 7, 0, Limits(5.0, 2, 4, 1, None), 60.0, False,
                                 "sqlite:///m.db", 0, "0.0.0.0", True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seed = 8        # type: ignore[misc]
    keywords = set(inspect.signature(cb.Searcher.fit).parameters) - {"self", "data"}
    fields = {cls: {f.name for f in dataclasses.fields(cls)} for cls in (RunOptions, Limits)}
    assert keywords == fields[RunOptions] - {"limits"} | fields[Limits]

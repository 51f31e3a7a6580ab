"""BOHB (``cb.BOHB``): ASHA's stops and promotions, with configurations proposed by a TPE model
fitted on the results at the highest rung that has enough; its decisions come from the seed and
the trials' metrics alone (invariant 12): the same on any timing, on 1 to 8 workers and through
a killed driver's resume; it works on nested spaces and every primitive; bad arguments are
named."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import optuna
import pandas as pd
import pytest
from _crash import assert_same_results, reference
from _models import build, digits
from _search_sim import expected_asha, no_build, outcome, simulate

import cerebro as cb
from cerebro.engine._search_state import apply_delta
from cerebro.search._bohb import Proposal
from cerebro.search._configs import check_config
from cerebro.search._optuna_params import optuna_params
from cerebro.search._space import sample_config
from cerebro.search._tpe import _suggest

SPACE = {"x": cb.uniform(-1, 1), "y": cb.uniform(-1, 1)}
OPTIMUM = (0.3, -0.4)
MLP = {"kind": "mlp", "hidden": cb.choice([64, 256]), "penalty": cb.uniform(0, 0.5)}
CNN = {"kind": "cnn", "filters": cb.choice([16, 32]), "layers": cb.randint(2, 5), "penalty": cb.uniform(0.5, 1)}
EVERY = {"a": cb.choice(["relu", "tanh"]), "b": cb.uniform(0, 1), "c": cb.loguniform(1e-4, 1e-1),
         "d": cb.randint(2, 5), "e": cb.quniform(0.1, 1.0, 0.1), "f": "constant", "model": cb.choice([MLP, CNN]),
         "optimizer": {"momentum": cb.uniform(0.5, 0.99), "nesterov": cb.choice([True, False])}}


def distance(config: dict) -> float:
    return math.dist((config["x"], config["y"]), OPTIMUM)


def bowl(config: dict, epoch: int) -> dict:
    """A 2-D quadratic whose learning curves fall towards it with the epochs."""
    return {"val_loss": distance(config) ** 2 + 1.0 / epoch}


def curve(config: dict, epoch: int, values: list[float]) -> float:
    """``bowl`` for tests/_search_sim.py's simulator, with curves that cross: a rung's ranking
    is not the last epoch's."""
    return distance(config) ** 2 + (1.0 + config["y"]) / epoch


def bohb(space=SPACE, **arguments) -> cb.BOHB:
    settings = {"num_trials": 40, "max_epochs": 9, "grace_period": 1, "reduction_factor": 3, "max_concurrent": 4,
                "n_startup_trials": 4, **arguments}
    return cb.BOHB(no_build, space, **settings)


def proposed_by(searcher: cb.BOHB) -> dict[str, str]:
    return {trial_id: proposal["by"] for trial_id, proposal in searcher.state()["proposals"].items()}


def journaled_state(result: cb.Result) -> dict:
    """The searcher's last state as the run's journal holds it (snapshots and deltas)."""
    state = None
    for event in result.store.events():
        if event["event"] == "search_state":
            state = event["state"] if "state" in event else apply_delta(state, event["delta"])
    return state


# --- (a) decisions from the seed and the metrics alone ---------------------------------------------------------------
def test_the_decisions_do_not_depend_on_the_order_results_arrive_in():
    runs, searchers = [], []
    for timing in range(6):
        searchers.append(bohb())
        runs.append(outcome(simulate(searchers[-1], curve, seed=3, timing_seed=timing)))
    assert all(run == runs[0] for run in runs[1:])
    assert all(s.state() == searchers[0].state() for s in searchers[1:])     # how each trial was proposed too
    by = list(proposed_by(searchers[0]).values())
    assert by.count(Proposal.MODEL.value) >= 10 and Proposal.RANDOM.value in by       # the model was used
    assert {status for _, _, status, *_ in runs[0]} == {"completed", "stopped"}
    assert outcome(simulate(bohb(), curve, seed=4)) != runs[0]         # the seed does matter


def test_the_same_trials_stops_and_proposals_on_1_2_4_and_8_workers(tmp_path):
    results = {w: cb.simulate(bohb(num_trials=30), bowl, workers=w, seed=5, store=tmp_path / str(w))
               for w in (1, 2, 4, 8)}
    one = results[1]
    shown = [(t.trial_id, t.config, t.status, t.reason, t.epochs) for t in one.trials]
    assert len(shown) == 30 and any(t.status == "stopped" for t in one.trials)
    states = {w: journaled_state(r) for w, r in results.items()}
    assert any(p["by"] == "model" for p in states[1]["proposals"].values())
    for w in (2, 4, 8):
        assert [(t.trial_id, t.config, t.status, t.reason, t.epochs) for t in results[w].trials] == shown
        pd.testing.assert_frame_equal(results[w].history(), one.history(), check_exact=True)
        assert states[w]["proposals"] == states[1]["proposals"]
    assert results[8].anytime().time.iloc[-1] < one.anytime().time.iloc[-1]    # more workers, sooner


def test_stops_and_promotions_are_successive_halvings_of_each_kind_of_trial():
    """ASHA's rungs with successive halving's rule (the top floor(n / 3) go on, at least one),
    the trials drawn at random judged among themselves and the model's proposals among theirs."""
    searcher = bohb(num_trials=40, max_concurrent=5)
    trials = simulate(searcher, lambda config, epoch, values: distance(config), seed=8, timing_seed=2)
    by = proposed_by(searcher)
    for model in (True, False):
        kind = [t for t in trials.values() if (by[t.trial_id] == Proposal.MODEL.value) == model]
        ended, penalties = [t.epoch for t in kind], [distance(t.config) for t in kind]
        assert len(kind) >= 10 and ended == expected_asha(penalties, [1, 3], 3, 9, strict=True)
        assert ended != expected_asha(penalties, [1, 3], 3, 9)         # ASHA's own ceil keeps more
        stopped = next(t for t in kind if t.status == "stopped")
        assert searcher.stop_reason(stopped.trial_id).startswith(f"stopped at rung {[1, 3].index(stopped.epoch)} ")
        assert searcher.stop_reason(stopped.trial_id).endswith(
            ", among the trials the model proposed" if model else ", among the trials drawn at random")
    everyone = [t.epoch for t in trials.values()]
    assert everyone != expected_asha([distance(t.config) for t in trials.values()], [1, 3], 3, 9, strict=True)


def test_failed_trials_hold_up_nothing():
    trials = simulate(bohb(), curve, seed=2, fail=lambda config: config["x"] > 0.6)
    assert len(trials) == 40 and sum(t.status == "failed" for t in trials.values()) >= 1
    assert {t.status for t in trials.values()} <= {"completed", "stopped", "failed"}


def test_at_most_max_concurrent_trials_are_live_and_the_state_is_json():
    searcher = bohb(max_concurrent=3)
    most = 0
    original = searcher.suggest

    def suggest():
        nonlocal most
        requests = original()
        most = max(most, searcher._live())
        return requests
    searcher.suggest = suggest
    simulate(searcher, curve, seed=1)
    assert most == 3
    state = json.loads(json.dumps(searcher.state()))
    assert state["created"] == 40 and len(state["proposals"]) == 40
    for proposal in state["proposals"].values():
        assert proposal["by"] in {p.value for p in Proposal}
        if proposal["by"] == "model":
            assert proposal["epoch"] in (1, 3, 9) and proposal["points"] >= len(SPACE) + 1


@pytest.mark.parametrize("concurrent", [1, 3])
def test_each_proposal_sees_every_trial_that_could_have_ended_before_it(concurrent):
    """Trial i's model is told the trials 0 .. i - 1 - (max_concurrent - 1) * epoch // grace_period
    at its epoch: with one trial at a time, every trial before it, as sequential BOHB sees them."""
    searcher = bohb(max_concurrent=concurrent, num_trials=30)
    simulate(searcher, curve, seed=6, timing_seed=1)
    models = [(i, p) for i, p in enumerate(searcher.state()["proposals"].values()) if p["by"] == "model"]
    assert len(models) >= 10
    for i, proposal in models:      # nothing failed: each told trial reached the epoch or was stopped before it
        assert proposal["points"] + proposal["stopped"] == i - (concurrent - 1) * proposal["epoch"]


# --- (b) a killed driver resumes to the same run, bitwise ------------------------------------------------------------
@pytest.mark.slow
def test_a_run_killed_after_its_model_proposed_resumes_to_the_uninterrupted_results(tmp_path):
    store = str(tmp_path / "run")
    child = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "_crash.py"), store,
                            "bohb-decision"], capture_output=True, text=True, timeout=300)
    assert child.returncode == -9, child.stderr[-2000:]        # killed, not finished
    killed = cb.load(store)
    assert killed.state == "died" and not killed.finished
    proposals = journaled_state(killed)["proposals"].values()
    assert any(p["by"] == "model" for p in proposals)     # killed after the model was used
    resumed = cb.resume(store, verbose=0)
    expected = reference("bohb-decision").fit(digits(partitions=4), backend=cb.LocalBackend(2, threads_per_worker=1),
                                              store=tmp_path / "uninterrupted", seed=5, verbose=0)
    assert_same_results(resumed, expected)
    assert len(resumed.trials) == 12


# --- (c) the model is used --------------------------------------------------------------------------------------------
def test_after_startup_the_model_proposes_nearer_the_optimum_than_random_draws():
    """On the same seeds, BOHB's later trials lie nearer the optimum than random search's (on
    average, and on most seeds); in each run, its model's proposals nearer than its own random ones."""
    nearer, late, random_late = [], [], []
    for seed in range(5):
        searcher = bohb(num_trials=60)
        result = cb.simulate(searcher, bowl, workers=2, seed=seed)
        random = cb.simulate(cb.RandomSearch(no_build, SPACE, num_trials=60, epochs=1), bowl, seed=seed)
        late.append(np.mean([distance(t.config) for t in result.trials[30:]]))
        random_late.append(np.mean([distance(t.config) for t in random.trials[30:]]))
        by = proposed_by(searcher)
        model = [distance(t.config) for t in result.trials if by[t.trial_id] == "model"]
        drawn = [distance(t.config) for t in result.trials if by[t.trial_id] != "model"]
        nearer.append(np.mean(model) < np.mean(drawn))
    assert all(nearer)
    assert np.mean(late) < 0.8 * np.mean(random_late) and sum(a < b for a, b in zip(late, random_late)) >= 4


# --- (d) nested spaces and every primitive ----------------------------------------------------------------------------
def test_every_primitive_and_nested_space_is_proposed_by_the_model_inside_the_space():
    searcher = bohb(EVERY, num_trials=60, min_points_in_model=4)
    trials = simulate(searcher, lambda config, epoch, values: config["b"] + config["model"]["penalty"] / epoch, seed=1)
    by = proposed_by(searcher)
    assert list(by.values()).count("model") >= 10
    for t in trials.values():
        assert check_config(EVERY, t.config) == t.config and list(t.config) == list(EVERY)
        assert t.config["f"] == "constant" and isinstance(t.config["d"], int)
        assert math.isclose(t.config["e"] / 0.1, round(t.config["e"] / 0.1))
    assert {t.config["model"]["kind"] for t in trials.values()} == {"mlp", "cnn"}
    mlp = {how: np.mean([t.config["model"]["kind"] == "mlp" for t in trials.values() if (by[t.trial_id] == "model")
                         == (how == "model")]) for how in ("model", "drawn")}
    assert mlp["model"] > mlp["drawn"]         # the model learnt the better branch (lower penalties)


def test_a_config_reads_back_as_the_optuna_parameters_that_suggest_it():
    """``optuna_params`` inverts ``_suggest``: a fixed trial with its parameters gives the config
    back, and Optuna takes them as an observation."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        config = sample_config(EVERY, rng)
        params, distributions = optuna_params(EVERY, config)
        assert {key: _suggest(optuna.trial.FixedTrial(params), node, key) for key, node in EVERY.items()} == config
        optuna.trial.create_trial(params=params, distributions=distributions, value=0.0)
        index = params["model"]
        assert {name for name in params if name.startswith("model[")} == \
            {f"model[{index}].{key}" for key in ("hidden", "penalty") if index == 0} | \
            {f"model[{index}].{key}" for key in ("filters", "layers", "penalty") if index == 1}


# --- (e) bad arguments ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arguments, message", [
    (dict(max_epochs=9, grace_period=10), "grace_period=10 must be at most max_epochs=9"),
    (dict(random_fraction=1.5), "random_fraction=1.5 must be in [0, 1]"),
    (dict(random_fraction=-0.1), "random_fraction=-0.1 must be in [0, 1]"),
    (dict(random_fraction=math.nan), "random_fraction=nan must be in [0, 1]"),
    (dict(min_points_in_model=0), "min_points_in_model=0 must be an integer >= 1"),
    (dict(min_points_in_model=2.5), "min_points_in_model=2.5 must be an integer >= 1"),
    (dict(n_startup_trials=-1), "n_startup_trials=-1 must be an integer >= 0"),
    (dict(reduction_factor=1.5), "reduction_factor=1.5 must be a number >= 2"),
    (dict(max_concurrent=0), "max_concurrent=0 must be an integer >= 1"),
    (dict(num_trials=0), "num_trials=0 must be an integer >= 1"),
    (dict(space={"layers": cb.choice([[8], [8, 8]])}),
     "BOHB cannot sample space['layers']=choice([[8], [8, 8]]): its value [8] is not a number, string, bool or None "
     "(choose a name and map it inside build)"),
])
def test_bad_arguments_are_named_where_the_searcher_is_made(arguments, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        cb.BOHB(build, **{"space": SPACE, **arguments})


def test_a_run_cannot_be_extended_saying_why():
    with pytest.raises(ValueError, match=r"^a BOHB run cannot be extended: its rungs are placed by max_epochs, so "):
        bohb().extend(20)

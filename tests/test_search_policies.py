"""The adaptive searchers' decisions, driven without workers (tests/_search_sim.py): the
rules of the papers, and decisions that do not depend on the order results arrive in."""
from __future__ import annotations

import math

import numpy as np
import pytest
from _docs import module_of_section
from _search_sim import expected_asha, no_build, outcome, simulate

import cerebro as cb


def constant(config: dict, epoch: int, values: list[float]) -> float:
    """A rigged learning curve: the trial's ``penalty`` at every epoch."""
    return config["penalty"]


def improving(config: dict, epoch: int, values: list[float]) -> float:
    """Each epoch closes a part of the gap to ``penalty`` that grows with the learning rate."""
    previous = values[-1] if values else 1.0 + config["penalty"]
    return previous - min(config.get("lr", 0.05) * 5, 0.9) * (previous - config["penalty"])


HALVING = module_of_section("docs/extending.md", "A searcher")["SuccessiveHalving"]     # the worked example
SEARCHERS = {
    "halving": lambda: HALVING(no_build, {"penalty": cb.uniform(0, 1)}, num_trials=7, rung_epochs=2),
    "asha": lambda: cb.ASHA(no_build, {"penalty": cb.uniform(0, 1)}, num_trials=30, max_epochs=9, grace_period=1,
                            reduction_factor=3, max_concurrent=6),
    "hyperband": lambda: cb.Hyperband(no_build, {"penalty": cb.uniform(0, 1)}, max_epochs=27, eta=3),
    "pbt": lambda: cb.PBT(no_build, {"penalty": cb.uniform(0, 1), "lr": cb.loguniform(1e-3, 1e-1)}, population=8,
                          epochs=8, perturbation_interval=2),
    "tpe": lambda: cb.TPESearch(no_build, {"penalty": cb.uniform(0, 1), "lr": cb.loguniform(1e-3, 1e-1)},
                                num_trials=16, epochs=2, max_concurrent=4, n_startup_trials=4),
    "bohb": lambda: cb.BOHB(no_build, {"penalty": cb.uniform(0, 1), "lr": cb.loguniform(1e-3, 1e-1)}, num_trials=30,
                            max_epochs=9, grace_period=1, reduction_factor=3, max_concurrent=4, n_startup_trials=4),
    "tpe_pruned": lambda: cb.TPESearch(no_build, {"penalty": cb.uniform(0, 1), "lr": cb.loguniform(1e-3, 1e-1)},
                                       num_trials=16, epochs=9, max_concurrent=4, n_startup_trials=4,
                                       grace_period=1),
}


@pytest.mark.parametrize("name", sorted(SEARCHERS))
def test_decisions_do_not_depend_on_the_order_results_arrive_in(name):
    runs = [outcome(simulate(SEARCHERS[name](), improving, seed=3, timing_seed=t)) for t in range(5)]
    assert all(run == runs[0] for run in runs[1:])
    assert outcome(simulate(SEARCHERS[name](), improving, seed=4)) != runs[0]   # the seed does matter


def test_asha_promotes_exactly_the_top_of_each_rung():
    searcher = cb.ASHA(no_build, {"penalty": cb.uniform(0, 1)}, num_trials=40, max_epochs=27, grace_period=1,
                       reduction_factor=3, max_concurrent=7)
    trials = simulate(searcher, constant, seed=11, timing_seed=5)
    penalties = [t.config["penalty"] for t in trials.values()]
    assert [t.epoch for t in trials.values()] == expected_asha(penalties, [1, 3, 9], 3, 27)
    for t in trials.values():
        assert t.status == ("completed" if t.epoch == 27 else "stopped")
    stopped = next(t for t in trials.values() if t.status == "stopped")
    assert searcher.stop_reason(stopped.trial_id).startswith(f"stopped at rung {[1, 3, 9].index(stopped.epoch)} "
                                                              f"(epoch {stopped.epoch}): ranked ")


def test_asha_failed_trials_do_not_block_a_rung():
    searcher = cb.ASHA(no_build, {"penalty": cb.uniform(0, 1)}, num_trials=12, max_epochs=9, max_concurrent=4)
    trials = simulate(searcher, constant, seed=2, fail=lambda config: config["penalty"] > 0.8)
    assert {t.status for t in trials.values()} <= {"completed", "stopped", "failed"}
    assert sum(t.status == "failed" for t in trials.values()) >= 1
    assert all(t.status != "running" for t in trials.values())


def test_the_worked_examples_halving_keeps_the_better_half_of_each_rung_and_waits_for_no_failed_trial():
    trials = simulate(HALVING(no_build, {"penalty": cb.uniform(0, 1)}, num_trials=7, rung_epochs=2), constant,
                      seed=5, timing_seed=1)
    by_penalty = sorted(trials.values(), key=lambda t: t.config["penalty"])
    assert [t.epoch for t in by_penalty] == [8, 6, 4, 4, 2, 2, 2]       # 7 -> 4 -> 2 -> 1, two epochs a rung
    assert [t.status for t in by_penalty] == ["completed"] + ["stopped"] * 6
    failing = simulate(HALVING(no_build, {"penalty": cb.uniform(0, 1)}, num_trials=7, rung_epochs=2), constant,
                       seed=5, fail=lambda config: config["penalty"] == by_penalty[0].config["penalty"])
    assert sorted(t.status for t in failing.values()) == ["completed", "failed"] + ["stopped"] * 5


def test_hyperband_brackets_are_the_papers_table():
    brackets = cb.Hyperband(no_build, {"x": cb.uniform(0, 1)}, max_epochs=81, eta=3).brackets()
    assert [(b.s, b.keep, b.rung_epochs) for b in brackets] == [
        (4, [81, 27, 9, 3, 1], [1, 3, 9, 27, 81]),
        (3, [34, 11, 3, 1], [3, 9, 27, 81]),
        (2, [15, 5, 1], [9, 27, 81]),
        (1, [8, 2], [27, 81]),
        (0, [5], [81]),
    ]


def test_hyperband_keeps_the_best_of_each_rung_and_continues_them():
    searcher = cb.Hyperband(no_build, {"penalty": cb.uniform(0, 1)}, max_epochs=27, eta=3)
    trials = list(simulate(searcher, constant, seed=1, timing_seed=2).values())
    first = 0
    for bracket in searcher.brackets():
        members = trials[first:first + bracket.keep[0]]
        first += bracket.keep[0]
        for keep, rung_epoch in zip(bracket.keep, bracket.rung_epochs):
            reached = [t for t in members if t.epoch >= rung_epoch]
            assert len(reached) == keep
            best = sorted(members, key=lambda t: t.config["penalty"])[:keep]
            assert {t.trial_id for t in reached} == {t.trial_id for t in best}
        assert all(t.status == ("completed" if t.epoch == 27 else "stopped") for t in members)
    assert first == len(trials)


def test_pbt_bottom_quantile_copies_the_top_and_explores_inside_the_bounds():
    space = {"penalty": cb.uniform(0.1, 1), "lr": cb.loguniform(1e-3, 1e-1), "width": cb.choice([8, 16, 32]),
             "layers": cb.randint(1, 4), "fixed": 7}
    searcher = cb.PBT(no_build, space, population=8, epochs=9, perturbation_interval=3,
                      mutations=["penalty", "lr", "width", "layers"])
    trials = simulate(searcher, improving, seed=5)
    exploits = [(t.trial_id, *e) for t in trials.values() for e in t.exploits]
    assert {epoch for _, epoch, _, _ in exploits} == {3, 6}
    assert len(exploits) == 2 * 2            # quantile 0.25 of 8 trials, twice
    for config in (t.config for t in trials.values()):
        assert 0.1 <= config["penalty"] <= 1 and 1e-3 <= config["lr"] <= 1e-1
        assert config["width"] in (8, 16, 32) and config["layers"] in (1, 2, 3) and config["fixed"] == 7
    assert all(t.status == "completed" and t.epoch == 9 for t in trials.values())


def test_pbt_exploits_follow_the_ranking_at_each_interval():
    searcher = cb.PBT(no_build, {"penalty": cb.uniform(0, 1), "lr": cb.loguniform(1e-3, 1e-1)}, population=8,
                      epochs=4, perturbation_interval=2, resample_probability=0.0)
    initial = {f"t{i:04d}": config for i, config in enumerate(_initial_configs(searcher, seed=9))}
    trials = simulate(searcher, improving, seed=9)
    at_two = {trial_id: improving(initial[trial_id], 2, [improving(initial[trial_id], 1, [])]) for trial_id in initial}
    order = sorted(at_two, key=lambda trial_id: (at_two[trial_id], trial_id))
    exploited = {t.trial_id: t.exploits[0] for t in trials.values() if t.exploits}
    assert set(exploited) == set(order[-2:])
    for epoch, source, config in exploited.values():
        assert epoch == 2 and source in order[:2]
        scaled = [min(max(initial[source]["lr"] * factor, 1e-3), 1e-1) for factor in (0.8, 1.2)]
        assert any(config["lr"] == pytest.approx(value) for value in scaled), (config, scaled)


def _initial_configs(searcher, seed: int) -> list[dict]:
    searcher.start(seed)
    return [request.config for request in searcher.suggest()]


def quadratic(config: dict, epoch: int, values: list[float]) -> float:
    return sum((config[key] - target) ** 2 for key, target in (("x", 0.31), ("y", -0.42), ("z", 0.77)))


def test_tpe_beats_random_search_on_a_known_optimum():
    space = {"x": cb.uniform(-1, 1), "y": cb.uniform(-1, 1), "z": cb.uniform(-1, 1)}
    wins, tpe_best, random_best = 0, [], []
    for seed in range(5):
        tpe = simulate(cb.TPESearch(no_build, space, num_trials=40, epochs=1, max_concurrent=4), quadratic, seed=seed)
        rnd = simulate(cb.RandomSearch(no_build, space, num_trials=40, epochs=1), quadratic, seed=seed)
        tpe_best.append(min(t.values[-1] for t in tpe.values()))
        random_best.append(min(t.values[-1] for t in rnd.values()))
        wins += tpe_best[-1] < random_best[-1]
    assert wins >= 4, (tpe_best, random_best)
    assert np.mean(tpe_best) < np.mean(random_best) / 2


def test_tpe_tells_failed_trials_and_finishes():
    space = {"x": cb.uniform(-1, 1), "y": cb.uniform(-1, 1), "z": cb.uniform(-1, 1)}
    trials = simulate(cb.TPESearch(no_build, space, num_trials=12, epochs=1, max_concurrent=3, n_startup_trials=2),
                      quadratic, seed=0, fail=lambda config: config["x"] > 0.5)
    assert len(trials) == 12 and all(t.status in ("completed", "failed") for t in trials.values())


def test_tpe_maps_every_primitive_and_keeps_constants():
    space = {"a": cb.choice(["relu", "tanh"]), "b": cb.uniform(0, 1), "c": cb.loguniform(1e-4, 1e-1),
             "d": cb.randint(2, 5), "e": cb.quniform(0.1, 1.0, 0.1), "f": "constant"}
    trials = simulate(cb.TPESearch(no_build, space, num_trials=14, epochs=1, n_startup_trials=3),
                      lambda config, epoch, values: config["b"], seed=1)
    for config in (t.config for t in trials.values()):
        assert list(config) == list(space)
        assert config["a"] in ("relu", "tanh") and 0 <= config["b"] <= 1 and 1e-4 <= config["c"] <= 1e-1
        assert config["d"] in (2, 3, 4) and config["f"] == "constant"
        assert math.isclose(config["e"] / 0.1, round(config["e"] / 0.1)) and 0.1 <= config["e"] <= 1.0


def test_tpe_prunes_by_ashas_rule_and_tells_optuna_what_it_pruned():
    searcher = cb.TPESearch(no_build, {"penalty": cb.uniform(0, 1)}, num_trials=24, epochs=9, max_concurrent=5,
                            n_startup_trials=6, grace_period=1, reduction_factor=3)
    trials = simulate(searcher, constant, seed=8, timing_seed=1)
    penalties = [t.config["penalty"] for t in trials.values()]
    assert [t.epoch for t in trials.values()] == expected_asha(penalties, [1, 3], 3, 9)
    told = {entry["trial_id"]: entry for entry in searcher.state()["told"]}
    assert sorted(told) == sorted(trials)
    for t in trials.values():
        assert t.status == ("completed" if t.epoch == 9 else "stopped")
        assert told[t.trial_id]["state"] == ("COMPLETE" if t.status == "completed" else "PRUNED")
        assert told[t.trial_id]["value"] == t.config["penalty"]     # a pruned trial: its last reported value
    assert 0 < sum(t.status == "stopped" for t in trials.values()) < len(trials)
    stopped = next(t for t in trials.values() if t.status == "stopped")
    assert searcher.stop_reason(stopped.trial_id).startswith(f"stopped at rung {[1, 3].index(stopped.epoch)} ")


def test_tpe_without_grace_period_never_prunes():
    searcher = cb.TPESearch(no_build, {"penalty": cb.uniform(0, 1)}, num_trials=10, epochs=5, max_concurrent=3,
                            n_startup_trials=3)
    trials = simulate(searcher, constant, seed=8)
    assert all(t.status == "completed" and t.epoch == 5 for t in trials.values())
    assert {entry["state"] for entry in searcher.state()["told"]} == {"COMPLETE"}

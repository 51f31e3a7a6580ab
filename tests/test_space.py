"""Tests of the search-space primitives (cerebro/search/_space.py), invariant 4 of DESIGN.md.

They prove that every bad primitive fails at construction with its exact message, that every
primitive samples only from its documented range (randint excludes ``high``, quniform lands on
multiples of ``q`` inside [low, high], loguniform stays in [low, high)), that a seeded numpy
Generator fixes a whole configuration, that constants pass through ``sample_config`` as they
are, and what each primitive's repr says.
"""
from __future__ import annotations

import math
import re

import numpy as np
import pytest

import cerebro as cb
from cerebro.search._space import Distribution, check_space, sample_config

DRAWS = 2000


def draws(dist: Distribution, seed: int = 0, n: int = DRAWS) -> list:
    rng = np.random.default_rng(seed)
    return [dist.sample(rng) for _ in range(n)]


# --------------------------------------------------------------------------------------------
# constructor errors, each with its exact message
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make, message", [
    (lambda: cb.choice("abc"), "choice: values='abc' must be a list of options"),
    (lambda: cb.choice(b"ab"), "choice: values=b'ab' must be a list of options"),
    (lambda: cb.choice({1, 2}), "choice: values={1, 2} must be a list of options"),
    (lambda: cb.choice(5), "choice: values=5 must be a list of options"),
    (lambda: cb.choice([]), "choice: values=[] must hold at least one option"),
    (lambda: cb.choice(()), "choice: values=() must hold at least one option"),

    (lambda: cb.uniform(1, 1), "uniform: low=1 must be smaller than high=1"),
    (lambda: cb.uniform(2.0, 1.0), "uniform: low=2.0 must be smaller than high=1.0"),
    (lambda: cb.uniform(float("nan"), 1), "uniform: low=nan must be a finite number"),
    (lambda: cb.uniform(0, float("inf")), "uniform: high=inf must be a finite number"),
    (lambda: cb.uniform(True, 2), "uniform: low=True must be a finite number"),
    (lambda: cb.uniform("0", 1), "uniform: low='0' must be a finite number"),
    (lambda: cb.uniform(None, 1), "uniform: low=None must be a finite number"),

    (lambda: cb.loguniform(0, 1), "loguniform: low=0 must be greater than 0"),
    (lambda: cb.loguniform(-1e-3, 1), "loguniform: low=-0.001 must be greater than 0"),
    (lambda: cb.loguniform(1e-1, 1e-4), "loguniform: low=0.1 must be smaller than high=0.0001"),
    (lambda: cb.loguniform(1e-3, float("inf")), "loguniform: high=inf must be a finite number"),
    (lambda: cb.loguniform(float("-inf"), 1), "loguniform: low=-inf must be a finite number"),

    (lambda: cb.randint(1.0, 5), "randint: low=1.0 must be an integer"),
    (lambda: cb.randint(0, 5.5), "randint: high=5.5 must be an integer"),
    (lambda: cb.randint(False, 5), "randint: low=False must be an integer"),
    (lambda: cb.randint(0, True), "randint: high=True must be an integer"),
    (lambda: cb.randint(3, 3), "randint: low=3 must be smaller than high=3"),
    (lambda: cb.randint(5, 2), "randint: low=5 must be smaller than high=2"),

    (lambda: cb.quniform(0, 1, 0), "quniform: q=0 must be greater than 0"),
    (lambda: cb.quniform(0, 1, -0.5), "quniform: q=-0.5 must be greater than 0"),
    (lambda: cb.quniform(0, 1, float("nan")), "quniform: q=nan must be a finite number"),
    (lambda: cb.quniform(0, float("nan"), 1), "quniform: high=nan must be a finite number"),
    (lambda: cb.quniform(1, 1, 0.5), "quniform: low=1 must be smaller than high=1"),
])
def test_constructor_errors(make, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        make()


def test_randint_accepts_numpy_integers():
    dist = cb.randint(np.int64(2), np.int32(4))
    assert (dist.low, dist.high) == (2, 4)
    assert type(dist.low) is int and type(dist.high) is int


@pytest.mark.parametrize("space, error, message", [
    ([("lr", 0.1)], TypeError,
     "space=[('lr', 0.1)] must be a dict from parameter name to a value or primitive"),
    (None, TypeError, "space=None must be a dict from parameter name to a value or primitive"),
    ({}, ValueError, "space={} must name at least one parameter"),
    ({1: cb.choice([1, 2])}, TypeError, "space key 1 must be a string"),
])
def test_check_space_errors(space, error, message):
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        check_space(space)


def test_check_space_returns_a_valid_space_unchanged():
    space = {"lr": cb.loguniform(1e-4, 1e-1), "epochs_hint": 3}
    assert check_space(space) is space


# --------------------------------------------------------------------------------------------
# samples lie in range
# --------------------------------------------------------------------------------------------

def test_choice_samples_only_given_values_and_reaches_each():
    values = [32, "x", None, [1, 2]]
    samples = draws(cb.choice(values))
    assert all(any(s is v or s == v for v in values) for s in samples)
    assert {repr(s) for s in samples} == {repr(v) for v in values}


def test_choice_copies_its_values():
    values = [1, 2]
    dist = cb.choice(values)
    values.append(3)
    assert dist.values == [1, 2]
    assert set(draws(dist)) == {1, 2}


def test_uniform_samples_in_half_open_range():
    samples = draws(cb.uniform(-2.0, 3.0))
    assert all(type(s) is float and -2.0 <= s < 3.0 for s in samples)
    assert min(samples) < -1.5 and max(samples) > 2.5          # spread over the range


def test_loguniform_samples_in_range_and_spread_over_decades():
    low, high = 1e-4, 1e-1
    samples = draws(cb.loguniform(low, high))
    assert all(type(s) is float and low <= s < high for s in samples)
    decades = {math.floor(math.log10(s)) for s in samples}
    assert decades == {-4, -3, -2}                               # each decade reached
    # log-uniform: about a third of the draws in each decade, not 90% in the top one
    top = sum(s >= 1e-2 for s in samples) / len(samples)
    assert 0.25 < top < 0.42


def test_randint_excludes_high_and_reaches_every_value():
    samples = draws(cb.randint(3, 7))
    assert all(type(s) is int for s in samples)
    assert set(samples) == {3, 4, 5, 6}


def test_randint_of_width_one_always_gives_low():
    assert set(draws(cb.randint(-1, 0), n=50)) == {-1}


@pytest.mark.parametrize("low, high, q", [(0, 1, 0.1), (2, 10, 2), (-1.5, 1.5, 0.5), (0, 64, 16)])
def test_quniform_samples_are_multiples_of_q_within_closed_range(low, high, q):
    samples = draws(cb.quniform(low, high, q))
    assert all(type(s) is float and low <= s <= high for s in samples)
    assert all(math.isclose(s / q, round(s / q), abs_tol=1e-9) for s in samples)
    steps = {round(s / q) for s in samples}
    assert steps == set(range(round(low / q), round(high / q) + 1))   # both ends reachable


# --------------------------------------------------------------------------------------------
# sample_config: seeded, ordered, constants untouched
# --------------------------------------------------------------------------------------------

SPACE = {
    "lr": cb.loguniform(1e-4, 1e-1),
    "batch_size": cb.choice([32, 64, 128]),
    "dropout": cb.uniform(0.0, 0.5),
    "layers": cb.randint(1, 5),
    "hidden": cb.quniform(16, 256, 16),
    "optimizer": "adam",
    "epochs_hint": 3,
    "sizes": [1, 2, 3],
}


def test_same_seed_gives_same_config_sequence():
    a, b = np.random.default_rng(42), np.random.default_rng(42)
    first = [sample_config(SPACE, a) for _ in range(20)]
    second = [sample_config(SPACE, b) for _ in range(20)]
    assert first == second


def test_different_seeds_give_different_configs():
    a = sample_config(SPACE, np.random.default_rng(1))
    b = sample_config(SPACE, np.random.default_rng(2))
    assert a["lr"] != b["lr"] and a["dropout"] != b["dropout"]


def test_config_has_space_keys_in_order_and_constants_unchanged():
    config = sample_config(SPACE, np.random.default_rng(0))
    assert list(config) == list(SPACE)
    assert config["optimizer"] == "adam"
    assert config["epochs_hint"] == 3
    assert config["sizes"] == SPACE["sizes"]                # passed through as plain data, not sampled


def test_config_of_only_constants_draws_nothing():
    rng = np.random.default_rng(7)
    before = rng.bit_generator.state
    assert sample_config({"a": 1, "b": "x", "c": None}, rng) == {"a": 1, "b": "x", "c": None}
    assert rng.bit_generator.state == before


def test_sampled_values_are_plain_python_types():
    config = sample_config(SPACE, np.random.default_rng(3))
    assert type(config["lr"]) is float
    assert type(config["dropout"]) is float
    assert type(config["layers"]) is int
    assert type(config["hidden"]) is float
    assert type(config["batch_size"]) is int


# --------------------------------------------------------------------------------------------
# reprs
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dist, text", [
    (cb.choice([32, 64]), "choice([32, 64])"),
    (cb.choice(("relu", "tanh")), "choice(['relu', 'tanh'])"),
    (cb.uniform(0, 0.5), "uniform(0, 0.5)"),
    (cb.loguniform(1e-4, 0.1), "loguniform(0.0001, 0.1)"),
    (cb.randint(np.int64(1), 10), "randint(1, 10)"),
    (cb.quniform(16, 256, 16), "quniform(16, 256, 16)"),
])
def test_reprs(dist, text):
    assert repr(dist) == text


def test_quniform_stays_on_multiples_inside_bounds_that_are_not_multiples():
    dist = cb.quniform(0.05, 0.95, 0.2)
    values = {dist.sample(np.random.default_rng(seed)) for seed in range(200)}
    assert values == {0.2, 0.4, 0.6000000000000001, 0.8}
    with pytest.raises(ValueError, match=re.escape("quniform: no multiple of q=1 lies in [0.2, 0.8]")):
        cb.quniform(0.2, 0.8, 1)


def test_choice_values_become_plain_json_data():
    assert cb.choice(np.arange(1, 3)).values == [1, 2] and type(cb.choice(np.arange(1, 3)).values[0]) is int
    assert cb.choice([(64, 64), [32]]).values == [[64, 64], [32]]


@pytest.mark.parametrize("value", [object, float("nan")])
def test_values_that_cannot_be_stored_are_rejected_early(value):
    with pytest.raises(ValueError, match=re.escape(f"choice: {value!r} cannot be stored as a configuration value; "
                                                   "use numbers, strings, booleans, None or lists or dicts of "
                                                   "them (map names to objects inside build)")):
        cb.choice([value])
    with pytest.raises(ValueError, match=re.escape(f"space['act']: {value!r} cannot be stored")):
        check_space({"act": value})
    with pytest.raises(ValueError, match=re.escape(f"space['model']['act']: {value!r} cannot be stored")):
        check_space({"model": {"act": value, "lr": cb.uniform(0, 1)}})
    with pytest.raises(ValueError, match=re.escape(f"choice option 1['act']: {value!r} cannot be stored")):
        cb.choice([{"act": "relu"}, {"act": value}])

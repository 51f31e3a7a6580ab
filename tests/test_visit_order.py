"""The visit order (cerebro/engine/_visit_order.py): a function of (seed, trial, epoch,
partition count) only; every epoch visits every partition once; under the Latin scheme any
P consecutive trials sit on P different partitions at every step."""
from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cerebro.engine import VisitScheme, trial_name, visit_order

SEEDS = st.integers(0, 2**31 - 1)
SCHEMES = st.sampled_from(list(VisitScheme))


@settings(max_examples=300, deadline=None)
@given(SEEDS, st.integers(0, 5000), st.integers(1, 20), st.integers(1, 64), SCHEMES)
def test_every_epoch_visits_every_partition_once(seed, trial, epoch, partitions, scheme):
    order = visit_order(seed, trial_name(trial), epoch, partitions, scheme)
    assert sorted(order) == list(range(partitions))
    assert order == visit_order(seed, trial_name(trial), epoch, partitions, scheme)


@settings(max_examples=200, deadline=None)
@given(SEEDS, st.integers(0, 5000), st.integers(1, 20), st.integers(1, 40))
def test_any_p_consecutive_trials_sit_on_different_partitions_at_every_step(seed, first, epoch, partitions):
    orders = [visit_order(seed, trial_name(first + i), epoch, partitions) for i in range(partitions)]
    for step in range(partitions):
        assert sorted(order[step] for order in orders) == list(range(partitions))


@pytest.mark.parametrize("scheme", list(VisitScheme))
def test_orders_vary_across_epochs_trials_and_seeds(scheme):
    partitions = 8
    by_epoch = {tuple(visit_order(3, "t0002", epoch, partitions, scheme)) for epoch in range(1, 6)}
    assert len(by_epoch) == 5
    by_trial = {tuple(visit_order(3, trial_name(i), 1, partitions, scheme)) for i in range(partitions)}
    assert len(by_trial) == partitions
    assert visit_order(3, "t0002", 1, partitions, scheme) != visit_order(4, "t0002", 1, partitions, scheme)


def test_a_trial_follows_the_epochs_ring_from_its_own_offset():
    ring = visit_order(11, "t0000", 2, 6)
    for i in range(13):
        offset = i % 6
        assert visit_order(11, trial_name(i), 2, 6) == ring[offset:] + ring[:offset]


def test_random_scheme_is_the_order_runs_made_before_used():
    """Runs written before schemes existed resume with this order: a permutation seeded by
    (run seed, stream 3, trial index, epoch)."""
    for seed, trial, epoch, partitions in [(0, 0, 1, 4), (7, 3, 2, 8), (123, 41, 5, 13)]:
        state = np.random.SeedSequence([seed, 3, trial, epoch]).generate_state(1, np.uint64)[0] >> 1
        legacy = [int(p) for p in np.random.default_rng(int(state)).permutation(partitions)]
        assert visit_order(seed, trial_name(trial), epoch, partitions, VisitScheme.RANDOM) == legacy


def test_a_scheme_must_be_a_visit_scheme():
    msg = "scheme='latin' must be a VisitScheme (LATIN, RANDOM)"
    with pytest.raises(ValueError, match=re.escape(msg)):
        visit_order(0, "t0000", 1, 4, "latin")

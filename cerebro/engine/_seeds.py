"""Every random number in a run comes from a seed derived here (invariant 2).

Seeds depend only on the run seed and *what* is computed (trial, epoch, partition), never
on *where* or *when*, so any worker count, backend or timing gives the same numbers.
"""
from __future__ import annotations

import numpy as np

# Distinct streams, so a trial's init seed never equals one of its sub-epoch seeds.
_INIT, _SUBEPOCH, _VISIT_ORDER, _SEARCH = 1, 2, 3, 4


def trial_index(trial_id: str) -> int:
    """``"t0007"`` -> 7."""
    return int(trial_id[1:])


def trial_name(index: int) -> str:
    """7 -> ``"t0007"``: trials are named in creation order."""
    return f"t{index:04d}"


def _derive(*keys: int) -> int:
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1, np.uint64)[0] >> 1)


def init_seed(run_seed: int, trial_id: str) -> int:
    """Seed for building a trial's model (weight initialisation)."""
    return _derive(run_seed, _INIT, trial_index(trial_id))


def subepoch_seed(run_seed: int, trial_id: str, epoch: int, partition: int) -> int:
    """Seed for one train sub-epoch: batch order, dropout and any other torch randomness."""
    return _derive(run_seed, _SUBEPOCH, trial_index(trial_id), epoch, partition)


def visit_order(run_seed: int, trial_id: str, epoch: int, num_partitions: int) -> list[int]:
    """The order in which a trial trains on the partitions in one epoch."""
    rng = np.random.default_rng(_derive(run_seed, _VISIT_ORDER, trial_index(trial_id), epoch))
    return [int(p) for p in rng.permutation(num_partitions)]


def search_rng(run_seed: int) -> np.random.Generator:
    """The generator a searcher draws configurations from."""
    return np.random.default_rng(_derive(run_seed, _SEARCH))

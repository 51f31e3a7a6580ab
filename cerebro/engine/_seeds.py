"""Every random number in a run comes from a seed derived here (invariant 2).

Seeds depend only on the run seed and *what* is computed (trial, epoch, partition), never
on *where* or *when*, so any worker count, backend or timing gives the same numbers.
"""
from __future__ import annotations

import functools

import numpy as np

# Distinct streams, so a trial's init seed never equals one of its sub-epoch seeds.
_INIT, _SUBEPOCH, VISIT_TRIAL, _SEARCH, VISIT_RING, _PROPOSAL = 1, 2, 3, 4, 5, 6


def trial_index(trial_id: str) -> int:
    """``"t0007"`` -> 7."""
    return int(trial_id[1:])


@functools.cache      # searchers name every trial in their state at each decision
def trial_name(index: int) -> str:
    """7 -> ``"t0007"``: trials are named in creation order."""
    return f"t{index:04d}"


def derive_seed(*keys: int) -> int:
    """A 63-bit seed from a stream number and the keys of what it is for."""
    return int(np.random.SeedSequence([int(k) for k in keys]).generate_state(1, np.uint64)[0] >> 1)


def init_seed(run_seed: int, trial_id: str) -> int:
    """Seed for building a trial's model (weight initialisation)."""
    return derive_seed(run_seed, _INIT, trial_index(trial_id))


def subepoch_seed(run_seed: int, trial_id: str, epoch: int, partition: int) -> int:
    """Seed for one train sub-epoch: batch order, dropout and any other torch randomness."""
    return derive_seed(run_seed, _SUBEPOCH, trial_index(trial_id), epoch, partition)


def search_rng(run_seed: int) -> np.random.Generator:
    """The generator a searcher draws configurations from."""
    return np.random.default_rng(derive_seed(run_seed, _SEARCH))


def proposal_rng(run_seed: int, index: int) -> np.random.Generator:
    """The generator a model-based searcher draws trial ``index``'s proposal from (random or
    the model's, the model's sampler seed, a random config): one per trial, so the proposal
    is the same whenever, and after however many others, it is made."""
    return np.random.default_rng(derive_seed(run_seed, _PROPOSAL, index))

"""The visit order: in which order a trial trains on the partitions in one epoch.

It is a function of (run seed, trial, epoch, partition count) only, never of timing or of
the worker count, so every run with the same seed trains the same way (invariant 2). The
scheme a run uses is recorded in its ``run.json``; a run resumes with the scheme it started
with.

``LATIN`` (the default) is a seeded Latin-square rotation: each epoch draws one seeded
permutation ``ring`` of the partitions, shared by all trials, and trial *i* visits
``ring[(i + k) mod P]`` at step *k*. Any P consecutive trials therefore sit on P different
partitions at every step, so as many trials as workers never queue for one worker while
another idles, and a trial arriving at a partition finds it just left by the trial ahead of
it on the ring. Trials created later (ASHA, TPE, PBT, Hyperband) take the next offsets, so
they too spread over the partitions. The order still changes every epoch (a new ring) and
differs between trials (their offsets). ``benchmarks/scale.py`` measures it against the
other schemes: with equal trial costs it keeps every worker busy at any scale.

``RANDOM`` is the order of runs made before: an independent seeded permutation per trial
and epoch (Cerebro, VLDB 2020). Random orders collide: trials queue for the same worker while
others idle, which costs 9-41 % of the workers with equal trial costs (benchmarks/scale.py).
"""
from __future__ import annotations

import enum
import functools

import numpy as np

from ._seeds import VISIT_RING, VISIT_TRIAL, derive_seed, trial_index


class VisitScheme(enum.Enum):
    """How visit orders are drawn; the value is what ``run.json`` records."""

    LATIN = "latin"
    RANDOM = "random"


#: What a run directory without a recorded scheme used (runs made before schemes existed).
LEGACY_SCHEME = VisitScheme.RANDOM


def visit_order(run_seed: int, trial_id: str, epoch: int, num_partitions: int,
                scheme: VisitScheme = VisitScheme.LATIN) -> list[int]:
    """The partitions ``trial_id`` trains on in ``epoch``, in order.

    Example:
        >>> visit_order(0, "t0001", 1, 4) == visit_order(0, "t0000", 1, 4)[1:] + visit_order(0, "t0000", 1, 4)[:1]
        True
    """
    if scheme is VisitScheme.LATIN:
        ring = _ring(run_seed, epoch, num_partitions)
        offset = trial_index(trial_id) % num_partitions
        return list(ring[offset:] + ring[:offset])
    if scheme is VisitScheme.RANDOM:
        rng = np.random.default_rng(derive_seed(run_seed, VISIT_TRIAL, trial_index(trial_id), epoch))
        return [int(p) for p in rng.permutation(num_partitions)]
    raise ValueError(f"scheme={scheme!r} must be a VisitScheme ({', '.join(s.name for s in VisitScheme)})")


@functools.lru_cache(maxsize=64)
def _ring(run_seed: int, epoch: int, num_partitions: int) -> tuple[int, ...]:
    """One epoch's seeded permutation, shared by every trial (cached: every trial asks)."""
    rng = np.random.default_rng(derive_seed(run_seed, VISIT_RING, epoch))
    return tuple(int(p) for p in rng.permutation(num_partitions))

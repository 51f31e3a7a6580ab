"""Hyperparameter importance over a run's trials: Optuna's fANOVA evaluator (Hutter, Hoos &
Leyton-Brown, "An Efficient Approach for Assessing Hyperparameter Importance", ICML 2014),
fitted offline on each trial's config and its objective at its best epoch.

The distributions are read from the configs themselves (a numeric key spans the values the
trials took, on a log scale where the space drew it log-uniformly; any other key is
categorical), so the report needs neither the searcher nor its pickled code.
"""
from __future__ import annotations

import math
import random
from collections.abc import Collection
from typing import Any

from ._result import Result
from ._trial_result import flat_config

SAMPLED = 200        # the trials fANOVA sees at most


def importances(result: Result, log_keys: Collection[str] = ()) -> dict[str, float] | None:
    """Each varying hyperparameter's share of the objective's variance, largest first; None
    where fewer than 4 trials have an objective, fewer than 2 keys vary (one key explains all
    there is to explain) or the objective does not vary. Of more than :data:`SAMPLED` trials
    with an objective, fANOVA sees :data:`SAMPLED` drawn at random (seeded: the same each
    time): its trees' marginals cost O(trials²), 30 s at 1,000 trials, and the shares of 200
    differ from those of 500 by a few points.

    >>> importances(cb.load("runs/exp1"))          # doctest: +SKIP
    {'lr': 0.81, 'hidden': 0.12, 'batch_size': 0.07}
    """
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    scored = [(flat_config(t.config), t.best_metrics[result.metric]) for t in result.trials
              if _finite(t.best_metrics.get(result.metric))]
    if len(scored) > SAMPLED:       # in creation order still
        scored = [scored[i] for i in sorted(random.Random(0).sample(range(len(scored)), SAMPLED))]
    keys = [k for k in dict.fromkeys(k for config, _ in scored for k in config)
            if all(k in config for config, _ in scored) and len({repr(c[k]) for c, _ in scored}) > 1]
    if len(scored) < 4 or len(keys) < 2 or len({value for _, value in scored}) < 2:
        return None           # nothing to explain: fANOVA's trees would have no variance
    distributions: dict[str, Any] = {}
    for key in keys:
        values = [config[key] for config, _ in scored]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            log = key in log_keys and min(values) > 0
            distributions[key] = FloatDistribution(float(min(values)), float(max(values)), log=log)
        else:
            distributions[key] = CategoricalDistribution(sorted({repr(v) for v in values}))
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)     # no "A new study created" line
    try:
        study = optuna.create_study(direction="minimize" if result.mode == "min" else "maximize")
        for config, value in scored:
            params = {k: float(config[k]) if isinstance(distributions[k], FloatDistribution) else repr(config[k])
                      for k in keys}
            study.add_trial(optuna.trial.create_trial(params=params, distributions=distributions, value=value))
        evaluator = optuna.importance.FanovaImportanceEvaluator(seed=0)
        found = optuna.importance.get_param_importances(study, evaluator=evaluator, normalize=True)
    except RuntimeError:      # "zero total variance in all trees": the keys explain nothing
        return None
    finally:
        optuna.logging.set_verbosity(verbosity)
    return {key: float(share) for key, share in found.items()}


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)

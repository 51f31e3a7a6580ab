"""torchmetrics ``Metric`` objects as exact epoch metrics (F1, AUROC, precision at k, ...).

A per-batch mean (``cb.metrics``) cannot give an F1 or an AUROC over the whole set. A Metric
object can: on the worker it is updated batch by batch over a sub-epoch, and its *state* (its
counts, or the predictions it keeps) goes to the driver with the sub-epoch's sums. The driver
merges the partitions' states in partition order, the same on every worker count, so the
result is bitwise the same, and computes the value at the epoch's end with the trial's own
Metric object (:class:`ExactMetrics`). Only states merged by sum, concatenation, max or min
(torchmetrics' ``dist_reduce_fx``) can be merged exactly; any other is refused up front.
"""
from __future__ import annotations

import copy
import json
import sys
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeGuard

import torch

from ..store import pack_tensors, unpack_tensors

if TYPE_CHECKING:
    import torchmetrics

_MERGES = {"dim_zero_sum": "sum", "dim_zero_cat": "cat", "dim_zero_max": "max", "dim_zero_min": "min"}
_CACHED_CONFIGS = 32        # the driver's Metric objects, for this many configs at most
# Each merge of two partitions' values, the earlier partition's first.
_COMBINE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "sum": torch.add, "cat": lambda p, q: torch.cat([p, q]), "max": torch.maximum, "min": torch.minimum}


def is_metric(value: Any) -> TypeGuard[torchmetrics.Metric]:
    """Whether ``value`` is a torchmetrics ``Metric`` (torchmetrics is loaded if it is one)."""
    loaded = sys.modules.get("torchmetrics")
    return loaded is not None and isinstance(value, loaded.Metric)


def merges(name: str, metric: Any) -> dict[str, str]:
    """How each state of ``metric`` merges across partitions; refuses one that cannot."""
    found = {}
    for key, reduce in metric._reductions.items():
        how = _MERGES.get(getattr(reduce, "__name__", ""))
        if how is None:
            raise ValueError(f"metrics[{name!r}]={type(metric).__name__}: its state {key!r} is reduced by "
                             f"{getattr(reduce, '__name__', reduce)!r}; Cerebro merges partitions' states by sum, "
                             f"concatenation, max or min only")
        found[key] = how
    return found


def sub_epoch_state(name: str, metric: Any) -> dict[str, Any]:
    """``metric``'s state after a sub-epoch's updates, on the CPU and packed for the wire,
    with how it merges."""
    how = merges(name, metric)
    values = {}
    for key in how:
        value = getattr(metric, key)
        if isinstance(value, list):         # a concatenated state: its batches, as one tensor
            value = torch.cat([v.reshape(-1, *v.shape[1:]) for v in value]) if value else torch.zeros(0)
        values[key] = value.detach().to("cpu")
    return {"merge": how, "values": pack_tensors(values)}


def merge_states(a: Mapping[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    """Two sums' metric states as one: ``a``'s partitions before ``b``'s."""
    merged = dict(a)
    for name, state in b.items():
        if name not in merged:
            merged[name] = state
            continue
        values = {}
        for key, how in state["merge"].items():
            x, y = unpack_tensors(merged[name]["values"][key]), unpack_tensors(state["values"][key])
            values[key] = _COMBINE[how](x, y)
        merged[name] = {"merge": state["merge"], "values": values}
    return merged


class ExactMetrics:
    """On the driver: the value of each Metric over a whole epoch, from its merged state, with
    the Metric object the trial's ``build(config)`` makes (built once per config, model and
    all, then only its metrics kept)."""

    def __init__(self, build_blob: bytes) -> None:
        self.build_blob = build_blob          # the run's pickled build, unpickled when first needed
        self._build: Callable[[dict], Any] | None = None
        self._metrics: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def values(self, config: dict[str, Any], prefix: str, states: Mapping[str, Any]) -> dict[str, float]:
        """``{prefix_name: value}`` for each merged state in ``states``."""
        if not states:
            return {}
        metrics = self._of(config)
        return {f"{prefix}_{name}": _compute(metrics[name], state) for name, state in states.items()}

    def _of(self, config: dict[str, Any]) -> dict[str, Any]:
        key = json.dumps(config, sort_keys=True)
        if key not in self._metrics:
            if self._build is None:
                import cloudpickle
                self._build = cloudpickle.loads(self.build_blob)
            self._metrics[key] = self._build(config).exact_metrics()
            if len(self._metrics) > _CACHED_CONFIGS:
                self._metrics.popitem(last=False)
        self._metrics.move_to_end(key)
        return self._metrics[key]


def _compute(template: Any, state: Mapping[str, Any]) -> float:
    metric = copy.deepcopy(template)
    metric.reset()
    for key, value in unpack_tensors(state["values"]).items():
        setattr(metric, key, [value] if state["merge"][key] == "cat" else value)
    metric._update_count = 1          # updated: by the workers, merged here
    value = metric.compute()
    if isinstance(value, torch.Tensor) and value.numel() != 1:
        raise ValueError(f"{type(template).__name__} computed a tensor of shape {tuple(value.shape)}; an epoch "
                         f"metric is one number (e.g. average='macro')")
    return float(value)

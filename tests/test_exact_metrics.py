"""torchmetrics Metric objects as exact epoch metrics: F1 and AUROC over the whole validation
set equal scikit-learn's on the same predictions, bitwise the same on 1 and 2 workers, rank
the trials; a state that cannot be merged over partitions is refused up front; a Metric that
fails to compute fails its trial, not the run."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torchmetrics
from _models import check_exact_f1_and_auroc, digits, make_model

import cerebro as cb


def build(config: dict) -> cb.TorchTrainable:
    model = make_model("mlp")
    metrics = {"f1": torchmetrics.classification.MulticlassF1Score(10, average=config.get("average", "macro")),
               "auroc": torchmetrics.classification.MulticlassAUROC(10, average="macro"),
               "accuracy": cb.metrics.accuracy}
    return cb.TorchTrainable(model, torch.optim.Adam(model.parameters(), lr=config["lr"]),
                             torch.nn.functional.cross_entropy, batch_size=32, metrics=metrics)


@pytest.mark.slow
def test_f1_and_auroc_are_exact_over_the_whole_set_and_the_same_on_1_and_2_workers(tmp_path):
    search = cb.GridSearch(build, {"lr": cb.choice([1e-2, 1e-3])}, epochs=2, metric="val_f1", mode="max")
    one, two = (search.fit(digits(), workers=w, store=tmp_path / str(w), seed=0, verbose=0) for w in (1, 2))
    assert one.history().equals(two.history())
    check_exact_f1_and_auroc(one, *digits().validation_arrays())


@pytest.mark.slow
def test_a_metric_that_cannot_compute_fails_its_trial_not_the_run(tmp_path):
    search = cb.GridSearch(build, {"lr": 1e-2, "average": cb.choice(["macro", "none"])}, epochs=1,
                           metric="val_accuracy", mode="max")
    result = search.fit(digits(), workers=2, store=tmp_path / "run", seed=0, verbose=0)
    assert [t.status for t in result.trials] == ["completed", "failed"]
    assert result.trials[1].cause == ("ValueError: MulticlassF1Score computed a tensor of shape (10,); an "
                                             "epoch metric is one number (e.g. average='macro')")


class Median(torchmetrics.Metric):
    """A state merged by mean: partitions of different sizes cannot be merged exactly."""

    def __init__(self) -> None:
        super().__init__()
        self.add_state("middle", default=torch.tensor(0.0), dist_reduce_fx="mean")

    def update(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.middle = outputs.median()

    def compute(self) -> torch.Tensor:
        return self.middle


def test_a_metric_whose_state_cannot_be_merged_over_partitions_is_refused():
    model = torch.nn.Linear(4, 2)
    with pytest.raises(ValueError, match=re.escape("metrics['median']=Median: its state 'middle' is reduced by "
                                                   "'dim_zero_mean'; Cerebro merges partitions' states by sum, "
                                                   "concatenation, max or min only")):
        cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.functional.cross_entropy,
                          batch_size=4, metrics={"median": Median()})


def test_states_merge_in_partition_order_as_one_pass_over_the_rows():
    """Two sub-epochs' states merged give the metric of one pass over all rows, bitwise."""
    from cerebro.worker._exact import ExactMetrics, merge_states, sub_epoch_state
    rng = np.random.default_rng(0)
    outputs = torch.from_numpy(rng.random((50, 10), dtype=np.float32))
    targets = torch.from_numpy(rng.integers(0, 10, 50))
    parts = []
    for rows in (slice(0, 20), slice(20, 50)):
        metric = torchmetrics.classification.MulticlassAUROC(10)
        metric.update(outputs[rows], targets[rows])
        parts.append({"auroc": sub_epoch_state("auroc", metric)})
    merged = merge_states(*parts)
    whole = torchmetrics.classification.MulticlassAUROC(10)
    whole.update(outputs, targets)
    exact = ExactMetrics(b"")
    exact._metrics['{"c": 1}'] = {"auroc": torchmetrics.classification.MulticlassAUROC(10)}
    assert exact.values({"c": 1}, "val", merged) == {"val_auroc": float(whole.compute())}

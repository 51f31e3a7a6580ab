"""The fault-injection helpers hit exactly once across processes, and only in the phase named:
a fault test that hits twice, or in an eval it did not mean, tests something else."""
from __future__ import annotations

import multiprocessing

import pytest
import torch
from _faults import claim, striking

import cerebro as cb


def _race(markers: list[str], start, wins) -> None:
    for attempt, marker in enumerate(markers):
        start.wait()                       # every process tries each marker at the same moment
        if claim(marker, note="mine"):
            with wins.get_lock():
                wins[attempt] += 1


def test_of_many_processes_claiming_one_marker_at_once_exactly_one_wins(tmp_path):
    # 8 processes race for 20 markers in turn: 20 races, 8 forks of this big process (not 160).
    context = multiprocessing.get_context("fork")
    markers = [str(tmp_path / f"marker{attempt}") for attempt in range(20)]
    start, wins = context.Barrier(8), context.Array("i", len(markers))
    processes = [context.Process(target=_race, args=(markers, start, wins)) for _ in range(8)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(120)
    assert [p.exitcode for p in processes] == [0] * 8
    assert list(wins) == [1] * len(markers)
    assert all(open(marker).read() == "mine" for marker in markers)


def _trainable(strikes: list[str], phase: str, marker: str) -> cb.TorchTrainable:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    loss = striking(torch.nn.functional.cross_entropy,
                    lambda: strikes.append("training" if torch.is_grad_enabled() else "evaluating"),
                    marker=marker, phase=phase)
    return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=0.1), loss, batch_size=2)


BATCHES = [(torch.ones(2, 4), torch.tensor([0, 1]))] * 3


@pytest.mark.parametrize("phase, hit", [("train", ["training"]), ("eval", ["evaluating"])])
def test_a_fault_strikes_once_and_only_in_the_phase_it_names(tmp_path, phase, hit):
    strikes: list[str] = []
    trainable = _trainable(strikes, phase, str(tmp_path / "marker"))
    trainable.evaluate_batches(BATCHES)
    trainable.train_batches(BATCHES, seed=0, epoch=1)
    trainable.evaluate_batches(BATCHES)
    trainable.train_batches(BATCHES, seed=0, epoch=2)
    assert strikes == hit and (tmp_path / "marker").exists()


def test_a_fault_whose_condition_does_not_hold_leaves_its_marker_unclaimed(tmp_path):
    strikes: list[str] = []
    loss = striking(torch.nn.functional.cross_entropy, lambda: strikes.append("hit"), marker=str(tmp_path / "m"),
                    when=lambda: False, phase="any")
    loss(torch.zeros(2, 3, requires_grad=True), torch.tensor([0, 1]))
    assert strikes == [] and not (tmp_path / "m").exists()


def test_a_phase_that_does_not_exist_is_refused_where_the_build_is_written(tmp_path):
    with pytest.raises(ValueError, match=r"^phase='training' must be 'train', 'eval' or 'any'$"):
        striking(torch.nn.functional.cross_entropy, print, marker=str(tmp_path / "m"), phase="training")

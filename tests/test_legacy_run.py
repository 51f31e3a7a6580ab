"""A run directory written before the engine redesign (``fixtures/legacy_run``, an ASHA
search whose driver was SIGKILLed after 17 epochs; ``fixtures/make_legacy_run.py`` made it)
still loads, and resumes to the results of an uninterrupted run, bitwise. Its checkpoints
and searcher are pickles, which can run code when read: their weights are read, and the run
resumed, only when the caller trusts the directory (``trust=True``)."""
from __future__ import annotations

import dataclasses
import os
import shutil
import sys

import pandas as pd
import pytest
import torch

import cerebro as cb
from cerebro.data import PartitionLayout, SampleScheme, _arrays, read_layout

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
sys.path.insert(0, FIXTURES)

import make_legacy_run  # noqa: E402


@pytest.fixture
def legacy_run(tmp_path) -> str:
    """A copy: loading or resuming must not touch the committed fixture."""
    return shutil.copytree(os.path.join(FIXTURES, "legacy_run"), tmp_path / "legacy_run")


def test_a_run_directory_of_the_old_engine_loads(legacy_run):
    result = cb.load(legacy_run)
    assert not result.finished
    assert [t.trial_id for t in result.trials] == [f"t000{i}" for i in range(7)]
    assert [t.status for t in result.trials] == ["completed", "completed", "parked", "parked", "parked",
                                                 "stopped", "parked"]     # its driver died: they wait
    history = result.history()
    assert len(history) == 17
    assert history.groupby("trial_id").epoch.max().to_dict() == {
        "t0000": 4, "t0001": 4, "t0002": 3, "t0003": 3, "t0004": 1, "t0005": 1, "t0006": 1}
    assert len(result.schedule()) == 75
    with pytest.raises(cb.UntrustedStateError, match=r"t0000/checkpoint.state holds pickled states written by an "
                                                      r"older version of Cerebro, .* open it with trust=True"):
        result.trials[0].state_dict()
    weights = cb.load(legacy_run, trust=True).trials[0].state_dict()
    assert weights and all(w.dtype == torch.float32 for w in weights.values())


def test_an_old_run_resumes_only_when_trusted(legacy_run):
    journal = open(os.path.join(legacy_run, "journal.jsonl"), "rb").read()
    with pytest.raises(cb.UntrustedStateError, match="legacy_run holds pickled states .* nothing was read"):
        cb.resume(legacy_run, backend=cb.LocalBackend(2, threads_per_worker=1), verbose=0)
    assert open(os.path.join(legacy_run, "journal.jsonl"), "rb").read() == journal


def legacy_layout(*fields) -> PartitionLayout:
    """The layout the old engine wrote: no row groups, one torch permutation per sub-epoch."""
    return dataclasses.replace(PartitionLayout(*fields), row_group_rows=None, window=1,
                               sample_order=SampleScheme.PERMUTATION)


@pytest.mark.slow
def test_a_run_directory_of_the_old_engine_resumes_to_the_uninterrupted_results(legacy_run, tmp_path, monkeypatch):
    resumed = cb.resume(legacy_run, backend=cb.LocalBackend(2, threads_per_worker=1), verbose=0, trust=True)
    assert read_layout(os.path.join(legacy_run, "data")).sample_order is SampleScheme.PERMUTATION
    monkeypatch.setattr(_arrays, "PartitionLayout", legacy_layout)     # the old engine, uninterrupted
    expected = make_legacy_run.fit(str(tmp_path / "uninterrupted"))
    assert resumed.finished
    assert [(t.trial_id, t.config, t.status, t.reason) for t in resumed.trials] == \
           [(t.trial_id, t.config, t.status, t.reason) for t in expected.trials]
    # The old engine journaled no learning rate: its epochs have none, the resumed ones do.
    history, reference = resumed.history(), expected.history()
    journaled = history["train_lr"].isna()
    assert journaled.any() and not journaled.all()
    assert history.loc[~journaled, "train_lr"].tolist() == reference.loc[~journaled, "train_lr"].tolist()
    history, reference = history.drop(columns="train_lr"), reference.drop(columns="train_lr")
    if history[journaled].equals(reference[journaled]):
        # This machine's CPU kernels round as the fixture's did: the resumed epochs, from the
        # old engine's pickled states, are the uninterrupted run's bits.
        pd.testing.assert_frame_equal(history, reference, check_exact=True)
        for a, b in zip(resumed.trials, expected.trials):
            assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    else:
        # Another CPU rounded a last bit of the first 17 epochs differently; SGD carries it on.
        pd.testing.assert_frame_equal(history, reference, rtol=1e-5)
        for a, b in zip(resumed.trials, expected.trials):
            assert all(torch.allclose(v, b.state_dict()[k], rtol=1e-4, atol=1e-6) for k, v in a.state_dict().items())
    train = resumed.schedule()[lambda s: s.kind == "train"]
    assert not train.duplicated(["trial_id", "epoch", "partition"]).any() and len(train) == 2 * len(resumed.history())

"""Damage is never silent: a damaged line in the middle of a finished run's journal is
skipped with a warning naming the file and the line (the run stays finished, every other
history row is there), and a damaged latest checkpoint gives the newest sound weights with
a warning naming the file and the epoch they really come from."""
from __future__ import annotations

import os
import shutil

import pandas as pd
import pytest
import torch
from _models import build, digits

import cerebro as cb

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> cb.Result:
    return cb.GridSearch(build, {"lr": cb.choice([1e-2, 3e-2])}, epochs=3).fit(
        digits(partitions=2), workers=2, store=tmp_path_factory.mktemp("damage") / "run", seed=0, verbose=0)


def flip(path: str, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0x01]))


def test_a_damaged_middle_line_is_skipped_with_a_warning_and_the_run_stays_finished(finished, tmp_path):
    copy = shutil.copytree(finished.run_dir, tmp_path / "run")
    journal = os.path.join(copy, "journal.jsonl")
    lines = open(journal, "rb").read().splitlines(keepends=True)
    victim = next(i for i, line in enumerate(lines) if b'"event": "epoch_end"' in line and b'"epoch": 2' in line)
    flip(journal, sum(len(line) for line in lines[:victim]) + 30)
    with pytest.warns(UserWarning, match=rf"^{journal} line {victim + 1} is damaged \(it fails its CRC-32\) and "
                                         rf"was skipped$"):
        loaded = cb.load(copy)
    assert loaded.finished and [t.status for t in loaded.trials] == ["completed", "completed"]
    expected = finished.history()
    trial_id = lines[victim].split(b'"trial_id": "')[1][:5].decode()
    lost = expected[(expected.epoch == 2) & (expected.trial_id == trial_id)]
    pd.testing.assert_frame_equal(loaded.history(), expected.drop(lost.index).reset_index(drop=True))


def test_a_damaged_latest_checkpoint_says_which_epoch_the_weights_are_from(finished, tmp_path):
    """A finished trial keeps its best and last epochs (copied apart here): with the last
    damaged, its weights come from the best epoch's file, with a warning where that is an
    earlier epoch; with both damaged, the error names each file's problem."""
    copy = shutil.copytree(finished.run_dir, tmp_path / "run")
    path = os.path.join(copy, "trials", "t0001", "checkpoint.state")
    flip(path, os.path.getsize(path) - 100)
    trial, original = cb.load(copy).trials[1], finished.trials[1]
    if original.best_epoch == original.epochs:
        weights = trial.state_dict("last")       # the best epoch's file holds the last epoch too
    else:
        with pytest.warns(UserWarning, match=rf"^t0001's checkpoint of epoch 3 is damaged \({path}: ValueError: "
                                             rf".*CRC.*\); these weights are from epoch {original.best_epoch}$"):
            weights = trial.state_dict("last")
    expected = original.state_dict("best")
    assert all(torch.equal(weights[k], v) for k, v in expected.items())
    best = os.path.join(copy, "trials", "t0001", "checkpoint.best.state")
    flip(best, os.path.getsize(best) - 100)
    with pytest.raises(ValueError, match=r"every checkpoint of trial t0001 .* is damaged: .*CRC"):
        trial.state_dict("last")


def test_status_report_and_export_say_which_journal_line_is_damaged(finished, tmp_path):
    from click.testing import CliRunner

    from cerebro.cli import main
    copy = shutil.copytree(finished.run_dir, tmp_path / "run")
    journal = os.path.join(copy, "journal.jsonl")
    flip(journal, len(open(journal, "rb").readline()) + 30)            # line 2
    runner = CliRunner()
    for command in (["status", str(copy)], ["report", str(copy), "-o", str(tmp_path / "r.html")],
                    ["export", str(copy), "-o", str(tmp_path / "w.safetensors")]):
        with pytest.warns(UserWarning, match=rf"^{journal} line 2 is damaged \(it fails its CRC-32\) and was skipped$"):
            done = runner.invoke(main, command)
        assert done.exit_code == 0, (command, done.output)

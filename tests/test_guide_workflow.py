"""docs/guide.md's sections run as written: their Python blocks, one after the other in one
namespace, in a fresh directory, printing what the text says."""
from __future__ import annotations

import os
import sys

import pytest
from _docs import run_section

pytestmark = pytest.mark.slow
GUIDE = "docs/guide.md"


def test_the_selection_workflow_section_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace, out = run_section(GUIDE, "Selection workflow", 8)
    assert "kept no weights: the run kept only the best 1 finished trials'" in out
    assert "[10, 10]" in out
    steered = namespace["steered"]
    assert [(t.trial_id, t.status, t.reason) for t in steered.trials] == [
        ("t0000", "completed", None), ("t0001", "stopped", "stopped by the user"), ("t0002", "completed", None)]
    assert namespace["added"] == "t0002" and namespace["broken"].failure is not None
    assert namespace["finished"].finished and not namespace["budgeted"].finished


def test_the_applying_the_winner_section_runs_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])    # cerebro
    namespace, out = run_section(GUIDE, "Applying the winner", 4)
    top = namespace["top"]
    assert list(top.columns) == ["id", "class_1", "prob_1", "class_2", "prob_2", "class_3", "prob_3"]
    assert out.strip().endswith("0.0")


def test_the_learning_rate_schedules_section_runs_as_written(tmp_path, monkeypatch):
    """A plateau schedule and a one-cycle schedule given as a function: every trial completes,
    the one-cycle rate ends near zero, the plateau rate never rises."""
    monkeypatch.chdir(tmp_path)
    namespace, out = run_section(GUIDE, "Learning-rate schedules", 1)
    result = namespace["result"]
    assert [t.status for t in result.trials] == ["completed"] * 4 and "train_lr" in out
    history = result.history().sort_values(["trial_id", "epoch"])
    for _, rows in history.groupby("trial_id"):
        rates = rows["train_lr"].tolist()
        if rows["schedule"].iloc[0] == "one-cycle":
            assert rates[-1] < 1e-2 * rows["lr"].iloc[0]          # annealed: all 3 * steps_per_epoch steps taken
        else:
            assert rates[0] == rows["lr"].iloc[0] and rates == sorted(rates, reverse=True)


def test_the_warm_start_section_runs_as_written(tmp_path, monkeypatch):
    """The two best trials of the wide grid go on from their best epochs; configurations it
    never tried start from build."""
    monkeypatch.chdir(tmp_path)
    namespace, out = run_section(GUIDE, "Warm start", 1)
    wide, longer, best = namespace["wide"], namespace["longer"], namespace["best"]
    assert "warm_started_from" in out
    sources = {f"{wide.run_dir}:{t.trial_id}@{t.best_epoch}": t.config for t in best}
    for trial in longer.trials:
        if trial.config in sources.values():
            assert sources[trial.warm_started_from] == trial.config
        else:
            assert trial.warm_started_from is None
    assert sum(t.warm_started_from is not None for t in longer.trials) == 2


def test_the_metrics_section_runs_as_written(tmp_path, monkeypatch):
    """The best trial by val_f1 is the one with the highest exact F1 at its best epoch, for the
    torch and the Keras trainer."""
    monkeypatch.chdir(tmp_path)
    namespace, out = run_section(GUIDE, "Metrics", 2)
    for result in (namespace["result"], namespace["keras_result"]):
        assert [t.status for t in result.trials] == ["completed"] * 2
        assert result.best.best_metrics["val_f1"] == max(t.best_metrics["val_f1"] for t in result.trials)
    assert out.count("best_val_f1") == 2 and "train_f1" not in namespace["keras_result"].history()


def test_the_transfer_learning_section_runs_as_written_and_equals_the_plain_run(tmp_path, monkeypatch):
    """The backbone's weights come from a file; the history and the winner's outputs are the
    plain run's, as the section says."""
    monkeypatch.chdir(tmp_path)
    namespace, out = run_section(GUIDE, "Transfer learning", 2)
    assert out.splitlines()[-2:] == ["True", "True"]
    result = namespace["result"]
    assert {t.config["fine_tune"] for t in result.trials} == {0, 1}
    frozen, head = namespace["parts"](result.best.config)      # the checkpoint holds the head alone
    assert result.best.state_dict().keys() == head.state_dict().keys() and len(frozen.state_dict()) > 0

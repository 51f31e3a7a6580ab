"""A run in which every trial failed says so: ``Result.failure`` names the most common cause
with one trial's error, ``fit`` logs it, and ``cerebro run`` and ``cerebro resume`` exit 1;
a run with one good trial is not a failed run."""
from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import pandas as pd
import pytest
from _cli import cerebro
from _models import build, digits, failing_after

import cerebro as cb

# Every test here runs real workers.
pytestmark = pytest.mark.slow


def test_a_run_whose_every_trial_diverged_says_so_and_logs_it(tmp_path, caplog, monkeypatch, capsys):
    search = cb.GridSearch(build, {"diverge": cb.choice([True]), "lr": cb.choice([1e-2, 1e-3])}, epochs=2)
    with caplog.at_level(logging.ERROR, logger="cerebro"):
        result = search.fit(digits(partitions=2), workers=2, store=tmp_path / "run", seed=0, verbose=0)
    assert [t.status for t in result.trials] == ["diverged", "diverged"]
    cause = result.trials[0].cause          # the partitions differ: causes alike but for numbers are one
    assert cause in ("train loss became nan in epoch 1 on partition 0", "train loss became nan in epoch 1 on "
                                                                        "partition 1")
    assert result.failure == f"every trial of the run failed (2 diverged); the most common cause, in 2 of 2: " \
                             f"{cause}\nt0000's error:\n  {cause}"
    assert [r.getMessage().splitlines()[0] for r in caplog.records if r.name == "cerebro"] == \
        [result.failure.splitlines()[0]]
    assert cb.load(tmp_path / "run").failure == result.failure
    with pytest.raises(cb.results.NoBestTrialError, match=rf"^no trial of run '{re.escape(str(tmp_path / 'run'))}' "
                                                        r"finished with a finite 'val_loss'; its trials: "
                                                        r"t0000 diverged, t0001 diverged$"):
        _ = result.best
    pd.DataFrame({"x": [1.0]}).to_parquet(tmp_path / "in.parquet")
    monkeypatch.chdir(tmp_path)
    for command in (["export", "run", "-o", "m.safetensors"], ["predict", "run", "in.parquet", "-o", "o.parquet"]):
        done = cerebro(monkeypatch, capsys, *command)
        assert (done.returncode, done.stderr) == (1, f"error: no trial of run '{tmp_path / 'run'}' finished with a "
                                                     f"finite 'val_loss'; its trials: t0000 diverged, t0001 diverged\n")


def test_one_good_trial_makes_the_run_a_success(tmp_path, caplog):
    search = cb.GridSearch(build, {"diverge": cb.choice([True, False])}, epochs=1)
    with caplog.at_level(logging.ERROR, logger="cerebro"):
        result = search.fit(digits(partitions=2), workers=2, store=tmp_path / "run", seed=0, verbose=0)
    assert sorted(t.status for t in result.trials) == ["completed", "diverged"]
    assert result.failure is None and not [r for r in caplog.records if r.name == "cerebro"]


def test_cerebro_run_and_resume_exit_1_when_every_trial_failed(tmp_path, monkeypatch, capsys):
    script = tmp_path / "experiment.py"
    script.write_text("""
import cerebro as cb, torch
from cerebro import demo
from cerebro.worker import in_preflight
data = demo.load_data()
def build(config):
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    def loss(outputs, targets):
        if in_preflight():     # broken on the workers only, so the run starts
            return torch.nn.functional.cross_entropy(outputs, targets)
        raise RuntimeError(f"the loss of lr={config['lr']} is broken")
    return cb.TorchTrainable(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=config["lr"]),
                             loss=loss, batch_size=64)
search = cb.GridSearch(build, {"lr": cb.choice([0.1])}, epochs=1)
""")
    store = str(tmp_path / "run")
    ran = cerebro(monkeypatch, capsys, "run", str(script), "--workers", "1", "--store", store, "--seed", "0", "--quiet")
    assert ran.returncode == 1, ran.stderr[-2000:]
    assert "the run failed: every trial of the run failed (1 failed)" in ran.stderr
    assert "RuntimeError: the loss of lr=0.1 is broken" in ran.stderr
    resumed = cerebro(monkeypatch, capsys, "resume", store, "--quiet")
    assert resumed.returncode == 1 and "the run failed: every trial of the run failed (1 failed)" in resumed.stderr


def test_status_shows_a_failed_trial_in_one_line_and_with_trial_its_whole_traceback(tmp_path):
    from click.testing import CliRunner

    from cerebro.cli import main
    search = cb.GridSearch(failing_after(5, lr=3e-2), {"lr": cb.choice([1e-2, 3e-2])}, epochs=2)
    result = search.fit(digits(partitions=2), workers=2, store=tmp_path / "run", seed=0, verbose=0)
    failed = next(t for t in result.trials if t.status == "failed")
    assert failed.error.startswith("Traceback (most recent call last):")
    table = CliRunner().invoke(main, ["status", result.run_dir], env={"COLUMNS": "250"}).output
    assert "RuntimeError: bug: the loss fails after 5 steps" in table and "Traceback" not in table
    shown = CliRunner().invoke(main, ["status", result.run_dir, "--trial", failed.trial_id], env={"COLUMNS": "250"})
    assert shown.exit_code == 0
    lines = shown.output.splitlines()
    assert lines[0] == f"{failed.trial_id} failed after {failed.epochs} epochs"
    assert lines[1] == 'config: {"lr": 0.03}' and "error:" in lines
    assert shown.output.rstrip().endswith(failed.error.rstrip())      # the whole traceback, as journaled
    best = CliRunner().invoke(main, ["status", result.run_dir, "--trial", "best"])    # as export takes it
    assert best.output.splitlines()[0] == f"{result.best.trial_id} completed after 2 epochs"
    unknown = CliRunner().invoke(main, ["status", result.run_dir, "--trial", "t0099"])
    assert unknown.exit_code == 2 and "'t0099' is not a trial of" in unknown.output and "t0000, t0001" in unknown.output


def test_a_trial_that_ends_before_any_epoch_does_not_load_tensorflow_into_the_driver(tmp_path):
    """TensorBoard would import all of TensorFlow (seconds, hundreds of MB) where it is
    installed; the driver writes the event files without it, also where a trial's first
    TensorBoard record is its end."""
    script = tmp_path / "experiment.py"
    script.write_text(f"""
import sys
sys.path.insert(0, {os.path.dirname(__file__)!r})
from _models import build, digits
import cerebro as cb

if __name__ == "__main__":
    cb.GridSearch(build, {{"diverge": cb.choice([True])}}, epochs=1).fit(digits(partitions=1), workers=1,
                                                                      store="run", verbose=0)
    print("tensorflow" in sys.modules)
""")
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.stdout == "False\n", done.stderr[-2000:]
    assert os.listdir(tmp_path / "run" / "tensorboard") == ["t0000"]


def test_a_failed_trials_metrics_lead_neither_the_report_nor_the_metrics_endpoint(tmp_path):
    """One rule for what leads a run: ``result.best``'s. A trial that failed in its second
    epoch after a finite first is never shown as the best so far, on the page or in
    ``cerebro_best_metric``, however good its first epoch was."""
    from prometheus_client.core import CollectorRegistry
    from prometheus_client.exposition import generate_latest

    from cerebro.report._prometheus import RunCollector
    search = cb.GridSearch(failing_after(20, lr=3e-2), {"lr": cb.choice([3e-2])}, epochs=2)   # 15 steps an epoch
    result = search.fit(digits(partitions=2), workers=2, store=tmp_path / "run", seed=0, verbose=0)
    [trial] = result.trials
    assert trial.status == "failed" and trial.epochs == 1 and trial.best_metrics["val_loss"] > 0
    page = open(cb.report.write_report(result.run_dir, tmp_path / "report.html"), encoding="utf-8").read()
    assert "No trial that did not fail has a val_loss yet." in page and "Leading" not in page
    registry = CollectorRegistry()
    registry.register(RunCollector(result.run_dir))
    text = generate_latest(registry).decode()
    assert "# TYPE cerebro_best_metric gauge" in text and "\ncerebro_best_metric{" not in text

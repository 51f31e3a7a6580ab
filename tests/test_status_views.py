"""``cerebro status`` on a run of many trials fits a screen: the best ``--top`` trials, how many
ended each way, and ``--all`` for every one. The runs are simulated (``cb.simulate``): a real
run directory in milliseconds."""
from __future__ import annotations

import math
import subprocess
import sys

from _cli import cerebro

import cerebro as cb


def no_model(config):
    """Never called by cb.simulate."""


def many(tmp_path, trials: int) -> cb.Result:
    def objective(config, epoch):
        if config["width"] == 8:
            raise ValueError("a trial's own failure")
        return {"val_loss": abs(math.log10(config["lr"]) + 2)}
    space = {"lr": cb.loguniform(1e-4, 1e-1), "width": cb.choice([8, 16, 32, 64])}
    return cb.simulate(cb.RandomSearch(no_model, space, num_trials=trials, epochs=1), objective, workers=2, seed=4,
                       store=tmp_path / "run")


def shown_trials(stdout: str) -> list[str]:
    return [line.split()[0] for line in stdout.splitlines() if line.strip().startswith("t0")]


def test_status_shows_the_best_trials_and_the_count_of_each_status(tmp_path, monkeypatch, capsys):
    result = many(tmp_path, 300)
    shown = cerebro(monkeypatch, capsys, "status", str(tmp_path / "run"))
    assert shown.returncode == 0
    assert shown_trials(shown.stdout) == [t.trial_id for t in result.ranked()[:20]]
    failed = sum(t.status == "failed" for t in result.trials)
    assert 0 < failed < 300
    assert f"the best 20 of 300 trials ({300 - failed} completed, {failed} failed); --all shows every one" \
           in shown.stdout
    assert len(shown.stdout.splitlines()) < 40


def test_status_top_and_all(tmp_path, monkeypatch, capsys):
    result = many(tmp_path, 60)
    top = cerebro(monkeypatch, capsys, "status", str(tmp_path / "run"), "--top", "5")
    assert shown_trials(top.stdout) == [t.trial_id for t in result.ranked()[:5]]
    every = cerebro(monkeypatch, capsys, "status", str(tmp_path / "run"), "--all")
    assert shown_trials(every.stdout) == [t.trial_id for t in result.ranked()]
    assert "--all shows every one" not in every.stdout
    bad = cerebro(monkeypatch, capsys, "status", str(tmp_path / "run"), "--top", "0")
    assert bad.returncode == 2 and "Invalid value for '--top': 0 is not in the range x>=1." in bad.stderr


def test_status_reads_a_run_without_importing_pandas(tmp_path):
    """The status table is built from rows (0.4 s of a 10,000-trial run's 2 s was pandas' import)."""
    many(tmp_path, 30)
    shown = subprocess.run([sys.executable, "-X", "importtime", "-m", "cerebro", "status", str(tmp_path / "run")],
                           capture_output=True, text=True, check=True)
    imported = {line.rsplit("|", 1)[-1].strip() for line in shown.stderr.splitlines() if line.startswith("import time")}
    assert "cerebro.results._result" in imported and "pandas" not in imported
    assert "the best 20 of 30 trials" in shown.stdout

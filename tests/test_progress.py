"""The live view: plain lines where the output is no terminal, worker rows on a terminal,
nothing with verbose=0."""
from __future__ import annotations

import os
import pty
import select
import subprocess
import sys

import pytest
from _models import build, digits

import cerebro as cb

pytestmark = pytest.mark.slow
SPACE = {"lr": cb.choice([1e-2, 3e-3]), "hidden": cb.choice([16, 32])}
SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
from _models import build, digits
import cerebro as cb
cb.GridSearch(build, {space}, epochs=2, metric="val_accuracy", mode="max").fit(
    digits(partitions=2), workers=2, store={store!r}, seed=0)
"""


def test_plain_lines_when_the_output_is_not_a_terminal(tmp_path, capsys):
    cb.GridSearch(build, SPACE, epochs=2, metric="val_accuracy", mode="max").fit(
        digits(partitions=2), workers=2, store=tmp_path / "run", seed=0, verbose=1)
    err = capsys.readouterr().err
    assert "\x1b[" not in err                          # no cursor movement or colour codes
    lines = err.splitlines()
    assert lines[0] == f"cerebro run in {tmp_path / 'run'} on 2 workers"
    assert sum(line.startswith("t000") and " epoch " in line for line in lines) == 8
    epoch_lines = [line for line in lines if " epoch " in line and line.startswith("t000")]
    assert "(1/8 epochs" in epoch_lines[0] and "(8/8 epochs)" in epoch_lines[-1]
    assert any(line.startswith("t0000 epoch 1: train_loss=") for line in epoch_lines)
    assert sum(" completed after 2 epochs val_accuracy=" in line for line in lines) == 4


def test_verbose_0_prints_nothing(tmp_path, capsys):
    cb.GridSearch(build, SPACE, epochs=1).fit(digits(partitions=2), workers=2, store=tmp_path / "run", seed=0,
                                              verbose=0)
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_a_terminal_shows_every_worker_and_the_top_trials(tmp_path):
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(tests=os.path.dirname(os.path.abspath(__file__)),
                                    space='{"lr": cb.choice([1e-2, 3e-3]), "hidden": cb.choice([16, 32])}',
                                    store=str(tmp_path / "run")))
    controller, terminal = pty.openpty()
    child = subprocess.Popen([sys.executable, str(script)], stdin=terminal, stdout=terminal, stderr=terminal,
                             env={**os.environ, "TERM": "xterm-256color", "COLUMNS": "140"})
    os.close(terminal)
    output = b""
    while True:
        ready, _, _ = select.select([controller], [], [], 1)
        try:
            data = os.read(controller, 65536) if ready else b""
        except OSError:           # the child closed the terminal
            break
        if ready and not data:
            break
        output += data
        if not ready and child.poll() is not None:
            break
    assert child.wait(timeout=120) == 0
    text = output.decode(errors="replace")
    assert "\x1b[" in text                          # a live, redrawn view
    for row in ("worker 0", "worker 1", "top 5 by val_accuracy (max)", "utilization"):
        assert row in text


@pytest.mark.parametrize("workers", [1, 3])
def test_the_eta_waits_for_as_many_epochs_as_workers_after_the_first(workers):
    """Before that, it would mostly measure the start-up (data, first hops)."""
    import io

    from rich.console import Console

    from cerebro.observe._progress import ConsoleProgress
    out = io.StringIO()
    progress = ConsoleProgress("val_loss", "min", console=Console(file=out, width=200))
    progress.start("run", workers)
    for trial in range(3):
        progress.trial_created(f"t000{trial}", {"lr": 0.0031622776601683794}, 4)
    for epoch in range(6):
        progress.epoch_end(f"t000{epoch % 3}", epoch // 3 + 1, {"val_loss": 1.0 / (epoch + 1)})
    lines = [line for line in out.getvalue().splitlines() if " epoch " in line]
    assert ["ETA" in line for line in lines] == [False] * workers + [True] * (6 - workers)
    rendered = Console(file=io.StringIO(), width=200)
    rendered.print(progress._render())
    assert "lr=0.003162" in rendered.file.getvalue() and "0.0031622776" not in rendered.file.getvalue()


def test_a_trial_whose_first_epoch_has_no_finite_metric_is_left_out_of_the_top():
    """It has no best epoch yet; the live view ranked it as None and failed to render."""
    import io

    from rich.console import Console

    from cerebro.observe._progress import ConsoleProgress
    progress = ConsoleProgress("val_loss", "min", console=Console(file=io.StringIO(), width=200))
    progress.start("run", 1)
    progress.epoch_end("t0000", 1, {"val_loss": float("nan")})
    progress.epoch_end("t0001", 1, {"val_loss": 0.5})
    assert progress.ranked() == [("t0001", 0.5)]
    progress.epoch_end("t0000", 2, {"val_loss": 0.25})
    assert progress.ranked() == [("t0000", 0.25), ("t0001", 0.5)]
    rendered = Console(file=io.StringIO(), width=200)
    rendered.print(progress._render())
    assert [line.split()[:4] for line in rendered.file.getvalue().splitlines() if line.startswith("t000")] == \
        [["t0000", "2", "0.2500", "2"], ["t0001", "1", "0.5000", "1"]]

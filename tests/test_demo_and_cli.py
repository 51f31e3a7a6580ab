"""The demo's model selection converges like plain sequential SGD, and the CLI works."""
from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import textwrap

import pytest
import torch
from _models import build, digits
from click.testing import CliRunner

import cerebro as cb
from cerebro import demo
from cerebro.cli import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo_result(tmp_path_factory) -> cb.Result:
    return demo.search().fit(demo.load_data(), workers=2, seed=0, verbose=0,
                             store=tmp_path_factory.mktemp("demo") / "run")


def sequential_val_accuracy(config: dict, data: cb.Dataset, seed: int) -> float:
    """The textbook loop: one model, shuffled mini-batches over all training rows, each epoch."""
    torch.manual_seed(seed)
    trainable = demo.build(config)
    features, label = (torch.from_numpy(a) for a in data.train_arrays())
    for _ in range(demo.EPOCHS):
        trainable.model.train()
        for rows in torch.randperm(len(features)).split(config["batch_size"]):
            trainable.optimizer.zero_grad()
            trainable.loss(trainable.model(features[rows]), label[rows]).backward()
            trainable.optimizer.step()
    val_features, val_label = (torch.from_numpy(a) for a in data.validation_arrays())
    with torch.no_grad():
        trainable.model.eval()
        return float(cb.metrics.accuracy(trainable.model(val_features), val_label))


def test_demo_selects_among_eight_configurations(demo_result):
    assert len(demo_result.trials) == 8
    assert all(t.status == "completed" and t.epochs == demo.EPOCHS for t in demo_result.trials)
    assert {t.config["architecture"] for t in demo_result.trials} == {"mlp", "cnn"}


def test_best_demo_trial_converges_like_sequential_sgd(demo_result):
    torch.set_num_threads(1)
    best = demo_result.best
    sequential = [sequential_val_accuracy(best.config, demo.load_data(), seed) for seed in range(3)]
    mop = best.metrics["val_accuracy"]
    # 359 validation rows: one row is 0.0028; seeds alone move sequential SGD by about 1%.
    assert abs(mop - statistics.mean(sequential)) <= max(0.02, 3 * statistics.stdev(sequential)), (mop, sequential)
    assert mop >= 0.95


def test_status_prints_the_ranked_trials(demo_result):
    output = CliRunner().invoke(main, ["status", demo_result.run_dir], terminal_width=200).output
    assert "finished: 8 of 8 trials ended" in output
    ranked = re.findall(r"^ ?(t\d{4}) ", output, flags=re.MULTILINE)
    assert ranked == demo_result.summary().trial_id.tolist()
    assert ranked[0] == demo_result.best.trial_id


def test_status_fits_80_columns_and_keeps_each_config_apart(demo_result):
    """The demo's lrs, 0.001 and 0.003, each as it is (not both ``0.00…``); the configs alike
    in every trial (none here) above the table, which drops the last epoch's metric to fit."""
    output = CliRunner().invoke(main, ["status", demo_result.run_dir], env={"COLUMNS": "80"}).output
    lines = output.splitlines()
    assert all(len(line) <= 80 for line in lines) and "…" not in output, output
    rows = [line.split() for line in lines if re.match(r"^ ?t\d{4} ", line)]
    summary = demo_result.summary()
    assert [row[0] for row in rows] == summary.trial_id.tolist()
    assert [row[-3:] for row in rows] == [[a, f"{lr:g}", str(b)] for a, lr, b in
                                          zip(summary.architecture, summary.lr, summary.batch_size)]
    assert {row[-2] for row in rows} == {"0.001", "0.003"}
    assert lines[-1] == "(left out to fit 80 columns: last; --trial ID shows one in full)"


class WorkersWithoutCerebro(cb.LocalBackend):
    """Workers whose Python cannot import what they run (as Spark executors without cerebro
    installed): each exits as it starts."""

    def _spawn(self, worker: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", "import cerebro_is_not_installed_here"],
                                stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)


def test_status_says_why_a_run_failed_before_its_first_trial(tmp_path):
    store = tmp_path / "run"
    with pytest.raises(cb.WorkerLostError, match=r"^worker 0 exited with code 1 while starting") as error:
        cb.GridSearch(build, {"lr": cb.choice([1e-2])}, epochs=1).fit(
            digits(partitions=1, rows=100), backend=WorkersWithoutCerebro(1, max_restarts=0), store=store, seed=0,
            verbose=0)
    loaded = cb.load(store)
    assert (loaded.state, loaded.run_error, loaded.trials) == ("failed", f"WorkerLostError: {error.value}", [])
    done = CliRunner().invoke(main, ["status", str(store)])
    assert (done.exit_code, done.output) == (0, f"failed before its first trial began; once its driver's error is "
                                                f"dealt with, `cerebro resume {store}` goes on:\n  WorkerLostError: "
                                                f"{error.value}\n")


def test_cerebro_demo_command_runs_a_model_selection(tmp_path):
    command = os.path.join(os.path.dirname(sys.executable), "cerebro")   # the installed console script
    completed = subprocess.run([command, "demo", "--epochs", "1"], capture_output=True, text=True, timeout=300,
                               cwd=tmp_path)
    assert completed.returncode == 0, completed.stderr
    [run] = os.listdir(tmp_path / "cerebro_runs")              # where its help and the README say
    assert re.fullmatch(r"demo-\d{8}-\d{6}-[0-9a-f]{4}", run), run
    loaded = cb.load(tmp_path / "cerebro_runs" / run)
    assert loaded.finished and len(loaded.trials) == 8
    assert f"best: {loaded.best.trial_id}" in completed.stdout


def test_run_command_runs_the_example_its_help_gives_as_written(tmp_path):
    """``cerebro run --help``'s example experiment.py, copied from the terminal, runs."""
    shown = subprocess.run([sys.executable, "-m", "cerebro", "run", "--help"], capture_output=True, text=True,
                           timeout=60).stdout
    example = shown.split("Example experiment.py (it runs as written):\n", 1)[1].split("\nOptions:", 1)[0]
    script = tmp_path / "experiment.py"
    script.write_text(textwrap.dedent(example))
    completed = subprocess.run([sys.executable, "-m", "cerebro", "run", str(script), "--workers", "1", "--store",
                                str(tmp_path / "run"), "--seed", "3", "--quiet"], capture_output=True, text=True,
                               timeout=600)
    assert completed.returncode == 0, completed.stderr[-2000:]
    loaded = cb.load(tmp_path / "run")
    assert loaded.finished and len(loaded.trials) == 16 and loaded.seed == 3
    assert loaded.best.trial_id in completed.stdout


def test_the_demos_help_and_the_readme_agree_on_its_time_and_folder():
    shown = " ".join(subprocess.run([sys.executable, "-m", "cerebro", "demo", "--help"], capture_output=True,
                                    text=True, timeout=60).stdout.split())
    with open(os.path.join(os.path.dirname(__file__), os.pardir, "README.md"), encoding="utf-8") as f:
        readme = " ".join(f.read().split())
    took = re.search(r"\(about (\d+ s on \d+ cores)\)", shown).group(1)
    folder = re.search(r"default: (\./cerebro_runs/demo-<time>)", shown).group(1)
    assert f"about {took})" in readme and f"`{folder}`" in readme


@pytest.mark.parametrize("args, code, message", [
    (["run", "{missing}"], 2, "does not exist"),
    (["run", "{empty}"], 2, "must define `data` (a cb.Dataset) and `search` (a searcher such as cb.GridSearch)"),
    (["status", "{tmp}"], 2, "is not a Cerebro run directory (no run.json)"),
    (["status", "{half_made}"], 2, "holds no run.json, only .lock, data: a fit stopped there before its run began, "
                                   "so there is nothing to resume; delete the directory, or give the next fit this "
                                   "store (it clears them)"),
    (["resume", "{failing}"], 1, "the run failed: "),
    (["resume", "{old}"], 2, "holds pickled states written by an older version of Cerebro, and reading a "
                             "pickle can run code; nothing was read. If you trust this run directory, open it "
                             "with trust=True"),
    (["frobnicate"], 2, "No such command"),
])
def test_exit_codes(tmp_path, args, code, message):
    (tmp_path / "empty.py").write_text("x = 1\n")
    failing = tmp_path / "failing"
    (failing / "trials").mkdir(parents=True)
    info = '{"seed": 0, "searcher": {"class": "GridSearch", "metric": "val_loss", "mode": "min"}, "workers": 1, ' \
           '"data": {"partitions": 1}'
    (failing / "run.json").write_text(info + ', "state_format": "data/1"}')
    old = tmp_path / "old"                          # written before states were data only
    old.mkdir()
    (old / "run.json").write_text(info + "}")
    half_made = tmp_path / "half"                   # a fit killed while it wrote the partitions
    (half_made / "data").mkdir(parents=True)
    (half_made / ".lock").write_text("")
    paths = {"missing": str(tmp_path / "missing.py"), "empty": str(tmp_path / "empty.py"), "tmp": str(tmp_path),
             "failing": str(failing), "old": str(old), "half_made": str(half_made)}
    completed = subprocess.run([sys.executable, "-m", "cerebro", *(a.format(**paths) for a in args)],
                               capture_output=True, text=True, timeout=120)
    assert completed.returncode == code, completed.stderr[-2000:]
    assert message in completed.stderr


def test_help_explains_every_command_with_examples():
    completed = subprocess.run([sys.executable, "-m", "cerebro", "--help"], capture_output=True, text=True, timeout=60)
    assert completed.returncode == 0
    for command in ("demo", "run", "status", "report", "resume", "export"):
        assert f"cerebro {command}" in completed.stdout
    assert "Exit codes: 0 success, 1 the run failed or was interrupted, 2 bad usage or bad input." in \
        " ".join(completed.stdout.split())


def test_the_demo_refuses_a_framework_it_does_not_know():
    with pytest.raises(ValueError, match=r"^framework='mxnet' is not one of 'torch', 'keras'$"):
        demo.search(framework="mxnet")


def test_ctrl_c_on_cerebro_run_prints_one_line_with_the_resume_command_and_no_traceback(tmp_path):
    """SIGINT to the whole process group, as a terminal's Ctrl-C sends it: the driver's and
    its workers'."""
    import signal
    import time

    from _faults import epochs_journaled
    script = tmp_path / "experiment.py"
    script.write_text("import cerebro as cb\nfrom cerebro import demo\ndata = demo.load_data()\n"
                      "search = cb.GridSearch(demo.build, {'architecture': cb.choice(['mlp']), 'lr': cb.choice([1e-3]),"
                      " 'batch_size': cb.choice([16])}, epochs=200)\n")
    store = str(tmp_path / "run")
    # As from a terminal: SIGINT handled, even where this test runs in a background job (which
    # starts with SIGINT ignored, passed on to its children, in which Python then ignores it too).
    as_from_a_terminal = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
                          "runpy.run_module('cerebro', run_name='__main__', alter_sys=True)")
    run = subprocess.Popen([sys.executable, "-c", as_from_a_terminal, "run", str(script), "--workers", "2", "--store",
                            store, "--seed", "0", "--quiet"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while epochs_journaled(store) < 1 and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)      # polling the journal, with a deadline
        assert epochs_journaled(store) >= 1 and run.poll() is None
        os.killpg(run.pid, signal.SIGINT)
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 1, (run.returncode, err[-3000:], out[-2000:])
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert err.strip().splitlines()[-1] == f"the run in {store} was interrupted; `cerebro resume {store}` finishes it"
    assert not cb.load(store).finished

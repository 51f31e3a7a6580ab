"""Every interpreter Cerebro starts keeps the working directory off its path (docs/security.md):
a module planted in a shared working directory (a scratch place of mode 1777) runs nowhere,
while the user's own modules beside their script load in the workers as in the script."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

import cerebro._python as python

HERE = os.path.dirname(os.path.abspath(__file__))
PLANTED = ("json", "numpy", "cerebro_worker_helper")     # what the fork server, a worker and a build import


def test_every_interpreter_cerebro_starts_leaves_the_working_directory_off_its_path(tmp_path, monkeypatch):
    (tmp_path / "json.py").write_text("raise SystemExit('planted json ran')\n")
    monkeypatch.chdir(tmp_path)
    command = python.python_module("json.tool", "--help")
    assert command[:3] == [sys.executable, "-P", "-m"]
    ran = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ""})
    assert ran.returncode == 0 and "planted" not in ran.stderr
    assert "planted json ran" in subprocess.run([sys.executable, "-m", "json.tool", "--help"], capture_output=True,
                                                text=True).stderr      # what -P keeps from happening


def test_a_path_entry_holding_the_path_separator_puts_no_directory_of_the_working_one_on_a_childs_path(
        tmp_path, monkeypatch):
    # PYTHONPATH splits at ':' and reads an empty entry as the working directory, a relative one
    # from it: a script in 'exp:' or 'exp 10:30' would have put the scratch place or its '30'
    # first on the fork server's path, and a planted json.py there would run as the user.
    scratch = tmp_path / "scratch"
    (scratch / "30").mkdir(parents=True)
    for where in (scratch, scratch / "30"):
        (where / "json.py").write_text("raise SystemExit('planted json ran')\n")
    for name in ("exp:", "exp 10:30"):
        (tmp_path / name).mkdir()
    monkeypatch.setattr(sys, "path", [str(tmp_path / "exp:"), str(tmp_path / "exp 10:30"), "", *sys.path])
    monkeypatch.chdir(scratch)
    path = python.drivers_path()
    assert path.split(os.pathsep) == [p for p in sys.path[3:] if os.path.isdir(p)]
    ran = subprocess.run(python.python_module("json.tool", "--help"), capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": path})
    assert ran.returncode == 0 and "planted" not in ran.stderr


@pytest.mark.slow
def test_modules_planted_in_a_shared_working_directory_never_run_and_the_users_own_still_load(tmp_path):
    scratch, home = tmp_path / "scratch", tmp_path / "home"
    scratch.mkdir(mode=0o1777)
    os.chmod(scratch, 0o1777)
    home.mkdir()
    ran = tmp_path / "planted-ran"
    for name in PLANTED:
        (scratch / f"{name}.py").write_text(f"open({str(ran)!r}, 'a').write({name!r} + '\\n')\n"
                                            f"raise ImportError('planted {name}')\n")
    (home / "users_layers.py").write_text("import torch\n\ndef head(n):\n    return torch.nn.Linear(64, n)\n")
    (home / "experiment.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(1, {HERE!r})
        import torch
        import cerebro as cb
        import cerebro.backends._forks as forks
        from _models import digits
        import users_layers

        def build(config):
            model = users_layers.head(10)
            return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=config["lr"]),
                                     torch.nn.functional.cross_entropy, batch_size=32)

        for forked in (True, False):      # forked from the fork server, and started as programs
            forks.AVAILABLE = forked
            result = cb.GridSearch(build, {{"lr": cb.choice([0.1, 0.01])}}, epochs=1).fit(
                digits(partitions=2), workers=2, store=f"run-{{forked}}", seed=0, verbose=0)
            print("statuses", sorted(t.status.value for t in result.trials))
    """))
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(home / "experiment.py")], cwd=scratch, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("statuses ['completed', 'completed']") == 2
    assert not ran.exists(), ran.read_text()


@pytest.mark.slow
def test_prediction_workers_started_as_programs_load_the_users_own_modules_as_training_workers_do(tmp_path):
    # A module with a global that cannot be pickled sends the build by reference: the training
    # workers imported it from the script's directory, cb.predict's started workers did not.
    home = tmp_path / "home"
    home.mkdir()
    (home / "users_locked_layers.py").write_text("import threading\nimport torch\nLOCK = threading.Lock()\n\n"
                                                 "def head(n):\n    return torch.nn.Linear(64, n)\n")
    (home / "experiment.py").write_text(textwrap.dedent(f"""
        import os, sys, warnings
        sys.path.insert(1, {HERE!r})
        import numpy as np, torch
        import cerebro as cb
        from _models import digits
        import users_locked_layers

        def build(config):
            model = users_locked_layers.head(10)
            return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                     torch.nn.functional.cross_entropy, batch_size=32)

        result = cb.GridSearch(build, {{"lr": cb.choice([0.1])}}, epochs=1).fit(
            digits(partitions=2), workers=2, store="run", seed=0, verbose=0)
        os.cpu_count = lambda: 4           # two threads a worker: started as programs, not forked
        with warnings.catch_warnings(record=True) as said:     # "prediction worker 1 failed (...)"
            warnings.simplefilter("always")
            out = cb.predict(result, np.zeros((3000, 64), np.float32), workers=2)
        print("predicted", out.shape, [str(w.message) for w in said if "failed" in str(w.message)])
    """))
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    done = subprocess.run([sys.executable, str(home / "experiment.py")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "predicted (3000, 10) []" in done.stdout, done.stdout[-2000:]


def test_ray_which_puts_the_working_directory_on_its_workers_path_is_said_to_where_others_can_write_it(
        tmp_path, caplog):
    from cerebro.backends._ray import _warn_if_shared
    shared, own = tmp_path / "shared", tmp_path / "own"
    shared.mkdir()
    own.mkdir(mode=0o755)
    os.chmod(shared, 0o1777)
    with caplog.at_level("WARNING", logger="cerebro"):
        _warn_if_shared(str(own))
        assert caplog.records == []
        _warn_if_shared(str(shared))
    [said] = caplog.records
    assert said.getMessage().startswith(f"the working directory {shared} is writable by other users, and Ray puts "
                                        f"it first on every worker's path")


@pytest.mark.parametrize("chosen", [None, "/usr/bin/python3"])
def test_sparks_local_python_workers_keep_the_working_directory_off_their_path(chosen, monkeypatch):
    from cerebro.data._spark_python import use_the_drivers_python_locally

    class Context:         # what of a SparkContext the function reads and sets
        def __init__(self, master: str) -> None:
            self.master, self.pythonExec, self.environment = master, "python3", {}

        def getConf(self):        # noqa: N802 (Spark's name)
            return {"spark.pyspark.python": chosen}
    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    local, cluster = Context("local[2]"), Context("spark://127.0.0.1:7077")
    use_the_drivers_python_locally(local)
    use_the_drivers_python_locally(cluster)
    assert local.environment["PYTHONSAFEPATH"] == "1" and HERE in local.environment["PYTHONPATH"].split(os.pathsep)
    assert local.pythonExec == (sys.executable if chosen is None else "python3")
    assert cluster.environment == {} and cluster.pythonExec == "python3"    # its executors' own directories

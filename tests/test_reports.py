"""What a run shows: TensorBoard event files read back, the HTML report of a finished and of
a live run, and the report/export/resume commands."""
from __future__ import annotations

import html
import json
import os
import pickle
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from _browser import CHROMIUM_FLAGS, chromium_path
from _crafted import Payload
from _faults import claim
from _models import build, digits
from click.testing import CliRunner
from safetensors import safe_open
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

import cerebro as cb
from cerebro.cli import main
from cerebro.report import _figures
from cerebro.report._dashboard import RunView
from cerebro.store import RunInfoError

pytestmark = pytest.mark.slow
SPACE = {"lr": cb.loguniform(1e-3, 1e-1), "hidden": cb.choice([16, 32])}


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> cb.Result:
    store = tmp_path_factory.mktemp("reports") / "run"
    return cb.ASHA(build, SPACE, num_trials=6, max_epochs=4, reduction_factor=2, metric="val_accuracy",
                   mode="max").fit(digits(partitions=2), workers=2, store=store, seed=0, verbose=0)


def test_tensorboard_has_every_epoch_of_every_trial_and_its_hparams(run):
    history = run.history()
    for trial in run.trials:
        scalars = EventAccumulator(os.path.join(run.run_dir, "tensorboard", trial.trial_id))
        scalars.Reload()
        assert sorted(scalars.Tags()["scalars"]) == ["train_accuracy", "train_loss", "train_lr", "val_accuracy",
                                                    "val_loss"]
        rows = history[history.trial_id == trial.trial_id]
        logged = [(s.step, s.value) for s in scalars.Scalars("val_accuracy")]
        assert [step for step, _ in logged] == rows.epoch.tolist()
        assert [value for _, value in logged] == pytest.approx(rows.val_accuracy.tolist(), rel=1e-6)
        rates = [s.value for s in scalars.Scalars("train_lr")]          # each epoch's learning rate too
        assert rates == pytest.approx(rows.train_lr.tolist(), rel=1e-6)
        # the HParams session is the trial's own run (named by its id), its metrics those scalars
        content = scalars.PluginTagToContent("hparams")
        start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
        hparams = start.session_start_info.hparams
        assert hparams["lr"].number_value == pytest.approx(trial.config["lr"])
        assert hparams["hidden"].string_value == str(trial.config["hidden"])      # shown as 32, not 32.000
        assert hparams["status"].string_value == trial.status
        experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
        assert "val_accuracy" in [info.name.tag for info in experiment.metric_infos]
        assert sorted(os.listdir(os.path.join(run.run_dir, "tensorboard", trial.trial_id)))[0].startswith("events")
        assert not os.path.exists(os.path.join(run.run_dir, "tensorboard", trial.trial_id, "hparams"))


def test_tensorboard_false_writes_none(tmp_path):
    cb.GridSearch(build, {"lr": cb.choice([1e-2])}, epochs=1).fit(digits(partitions=2), workers=2, verbose=0,
                                                                  store=tmp_path / "run", seed=0, tensorboard=False)
    assert not os.path.exists(tmp_path / "run" / "tensorboard")


def test_report_of_a_finished_run(run, tmp_path):
    path = cb.report.write_report(run.run_dir, tmp_path / "report.html")
    page = open(path, encoding="utf-8").read()
    assert "<script src=" not in page                 # plotly.js is inlined: no network needed
    for section in ("trials", "curves", "gantt", "parallel", "rungs"):
        assert f'id="{section}"' in page
    assert page.count("<tr class='status-") == len(run.trials)
    gantt = _figures.gantt(run)
    assert sum(len(trace.base) for trace in gantt.data) == len(run.schedule())     # one bar per sub-epoch
    assert {trace.name for trace in gantt.data} == {t.trial_id for t in run.trials}
    assert f"utilization {_figures.utilization(run.schedule(), 2):.3f}" in gantt.layout.title.text
    curves = _figures.learning_curves(run)
    # train loss, val loss, the objective, and the learning rate where a schedule changed it
    panels = 3 + (run.history()["train_lr"].nunique() > 1)
    assert len(curves.data) == panels * len(run.trials)
    assert [a.text for a in curves.layout.annotations][3:] == (["train_lr"] if panels == 4 else [])
    assert max(trace.line.width for trace in curves.data) == 4  # the best trial stands out


def test_the_report_leads_with_the_best_trial_and_its_export_command_and_reads_each_panel(run, tmp_path):
    page = open(cb.report.write_report(run.run_dir, tmp_path / "report.html"), encoding="utf-8").read()
    best = run.best
    assert (f"Best: <b>{best.trial_id}</b> at epoch {best.best_epoch}: val_accuracy = "
            f"<b>{best.best_metrics['val_accuracy']:.4f}</b>") in page
    command = f"cerebro export {run.run_dir} --trial {best.trial_id} -o model.safetensors"
    assert f"<code id='export'>{command}</code>" in page
    done = CliRunner().invoke(main, command.split()[1:-1] + [str(tmp_path / "model.safetensors")])
    assert done.exit_code == 0, done.output                   # the card's command works as shown
    counts = {s: sum(t.status == s for t in run.trials) for s in {t.status for t in run.trials}}
    assert all(f"{n} {status}" in page.split("id='counts'>", 1)[1].split("</p>", 1)[0]
               for status, n in counts.items())
    # hyperparameters as columns, those every trial shares said once above the table
    varying = [k for k in ("lr", "hidden") if len({t.config[k] for t in run.trials}) > 1]
    head = page.split("<thead>", 1)[1].split("</thead>", 1)[0]
    assert all(f"<th>{k}</th>" in head for k in varying) and "<th>config</th>" not in head
    parallel = _figures.parallel_coordinates(run, _figures.log_keys(run))
    assert _figures.log_keys(run) == {"lr"}
    assert [d.label for d in parallel.data[0].dimensions][:len(varying)] == [
        "lr (log)" if k == "lr" else k for k in varying]
    curves = _figures.learning_curves(run)
    assert curves.layout.yaxis.type == "log" and curves.layout.yaxis2.type == "log"   # the losses
    so_far = _figures.best_so_far(run).data[0].y
    assert list(so_far) == sorted(so_far) and so_far[-1] == max(t.best_metrics["val_accuracy"] for t in run.trials)
    shares = _figures.importances(run, {"lr"})
    assert (shares is None) == (len(varying) < 2)
    if shares is not None:
        assert set(shares) == set(varying) and sum(shares.values()) == pytest.approx(1.0)


def test_report_of_a_live_run_shows_what_is_done(run, tmp_path):
    live = tmp_path / "live"
    shutil.copytree(run.run_dir, live)
    with open(live / "journal.jsonl", "rb") as f:
        lines = f.readlines()
    with open(live / "journal.jsonl", "wb") as f:
        f.writelines(lines[:len(lines) // 2])       # as it was half way through
    result = cb.load(live)
    assert not result.finished
    page = open(cb.report.write_report(live), encoding="utf-8").read()
    assert "not finished (this page shows what is done so far)" in page
    assert sum(len(trace.base) for trace in _figures.gantt(result).data) == len(result.schedule())


def test_cli_report_export_and_resume(run, tmp_path):
    runner = CliRunner()
    done = runner.invoke(main, ["report", run.run_dir, "-o", str(tmp_path / "r.html")])
    assert done.exit_code == 0 and os.path.getsize(tmp_path / "r.html") > 100_000
    done = runner.invoke(main, ["export", run.run_dir, "-o", str(tmp_path / "best.safetensors")])
    assert done.exit_code == 0, done.output
    with safe_open(tmp_path / "best.safetensors", "pt") as saved:
        metadata = saved.metadata()
        weights = {k: saved.get_tensor(k) for k in saved.keys()}
    assert metadata["trial_id"] == run.best.trial_id and json.loads(metadata["config"]) == run.best.config
    assert int(metadata["epoch"]) == run.best.epochs
    expected = run.best.state_dict()
    assert list(weights) == sorted(expected) and all(torch.equal(weights[k], v) for k, v in expected.items())
    done = runner.invoke(main, ["export", run.run_dir, "-o", str(tmp_path / "best.pt")])
    assert done.exit_code == 2 and "'" + str(tmp_path / "best.pt") + "': the weights are written as safetensors" \
        in " ".join(done.output.split()) and not os.path.exists(tmp_path / "best.pt")
    done = runner.invoke(main, ["export", run.run_dir, "--trial", "t0001", "--torchscript", "-o",
                                str(tmp_path / "t1.ts")])
    assert done.exit_code == 0, done.output
    inputs = torch.rand(3, 64)
    scripted = torch.jit.load(tmp_path / "t1.ts")
    assert torch.equal(scripted(inputs), run.trials[1].model()(inputs))
    done = runner.invoke(main, ["export", run.run_dir, "--trial", "t0099", "-o", str(tmp_path / "x.safetensors")])
    assert done.exit_code == 2 and "'t0099' is not a trial of this run" in done.output
    done = runner.invoke(main, ["resume", run.run_dir, "--quiet"])
    assert done.exit_code == 0 and run.best.trial_id in done.output
    help_text = runner.invoke(main, ["--help"]).output
    for command in ("demo", "run", "status", "resume", "report", "export"):
        assert command in help_text
    assert json.loads(json.dumps(run.best.config)) == run.best.config


def test_a_report_html_linked_to_another_file_is_replaced_never_written_through(run, tmp_path):
    canary = tmp_path / "canary"
    canary.write_bytes(b"the canary\n")
    report = os.path.join(run.run_dir, "report.html")
    if os.path.lexists(report):
        os.unlink(report)
    os.symlink(canary, report)
    done = CliRunner().invoke(main, ["report", run.run_dir])
    assert done.exit_code == 0, done.output
    assert canary.read_bytes() == b"the canary\n"
    assert not os.path.islink(report) and os.path.getsize(report) > 100_000


def test_status_report_load_and_export_run_no_code_from_the_run_directory(run, tmp_path):
    """Only build.pkl is code; only TrialResult.model() (and resume, predict) unpickle it, and
    only where a run of this user signed it or the caller trusts the directory."""
    copy = shutil.copytree(run.run_dir, tmp_path / "shared_run")
    marker = tmp_path / "ran"
    with open(copy / "build.pkl", "wb") as f:        # a colleague's run directory, tampered with
        f.write(pickle.dumps(Payload(str(marker))))
    runner = CliRunner()
    for command in (["status", str(copy)], ["report", str(copy), "-o", str(tmp_path / "r.html")],
                    ["export", str(copy), "-o", str(tmp_path / "w.safetensors")]):
        done = runner.invoke(main, command)
        assert done.exit_code == 0, (command, done.output)
    loaded = cb.load(copy)
    assert loaded.best.trial_id == run.best.trial_id and loaded.best.state_dict()
    assert not marker.exists()
    with pytest.raises(cb.UntrustedCodeError, match=r"shared_run/build.pkl holds code .* nothing was loaded"):
        loaded.best.model()                          # its signature is not this user's: refused
    assert not marker.exists()
    with pytest.raises(TypeError, match="'int' object is not callable"):   # os.system's exit status
        cb.load(copy, trust=True).best.model()       # trusted, the build is unpickled, and so runs: by design
    assert marker.exists()


def test_an_output_that_cannot_be_written_is_refused_before_any_work_naming_the_argument(run, tmp_path, monkeypatch,
                                                                                         capsys):
    from _cli import cerebro
    missing = tmp_path / "no" / "such"
    with pytest.raises(ValueError, match=rf"^out='{tmp_path}' is a directory; give the path of a file to write$"):
        cb.report.write_report(run.run_dir, tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"^path='{missing}/m.safetensors': its directory '{missing}' does "
                                                r"not exist; create it first$"):
        run.best.save_weights(missing / "m.safetensors")
    with pytest.raises(FileNotFoundError, match=rf"^out='{missing}/o.parquet': its directory"):
        cb.predict(run.run_dir, np.zeros((2, 64), np.float32), out=missing / "o.parquet")
    assert not missing.exists()
    done = cerebro(monkeypatch, capsys, "report", run.run_dir, "-o", str(tmp_path))
    assert (done.returncode, done.stderr) == (2, f"error: out='{tmp_path}' is a directory; give the path of a file "
                                                 f"to write\n")
    done = cerebro(monkeypatch, capsys, "export", run.run_dir, "-o", str(missing / "m.onnx"))
    assert (done.returncode, done.stderr) == (2, f"error: out='{missing}/m.onnx': its directory '{missing}' does not "
                                                 f"exist; create it first\n")
    (tmp_path / "in.csv").write_text("a,b\n1,2\n")
    monkeypatch.chdir(tmp_path)
    for out, said in (("o.parquet", f"error: '{tmp_path}/in.csv' is not a Parquet file or directory ("),
                      ("o.csv", "Error: Invalid value for -o: 'o.csv': predictions are written as Parquet; name it "
                                "*.parquet")):
        done = cerebro(monkeypatch, capsys, "predict", run.run_dir, str(tmp_path / "in.csv"), "-o", out)
        assert done.returncode == 2 and done.stderr.splitlines()[-1].startswith(said), done.stderr


def test_the_command_line_says_a_warning_in_one_line(run):
    done = subprocess.run([sys.executable, "-m", "cerebro", "resume", run.run_dir, "--quiet"], capture_output=True,
                          text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, f"warning: run {run.run_dir!r} has finished; there is nothing to "
                                                 f"resume, so its Result is returned as it is\n")


def test_a_path_argument_given_something_else_names_it(run):
    features = np.zeros((2, 64), np.float32)
    with pytest.raises(TypeError, match=r"^run_or_result=array\(.*\) must be a path or URL \(a str or "
                                        r"os\.PathLike\), not ndarray$"):
        cb.predict(features, run.run_dir)                       # the arguments swapped
    with pytest.raises(TypeError, match=r"^run_dir=None must be a path or URL \(a str or os\.PathLike\), not "
                                        r"NoneType$"):
        cb.load(None)


def test_what_a_run_directory_says_is_text_on_the_page_never_markup(run, tmp_path):
    """The report and the dashboard show run.json's values; a tampered one cannot put
    markup (a script) on a page that someone opens."""
    copy = shutil.copytree(run.run_dir, tmp_path / "shared_run")
    info = json.loads((copy / "run.json").read_text())
    tag = "<img src=x onerror=alert(1)>"
    info["searcher"]["class"] = info["searcher"]["mode"] = tag        # strings run.json may hold
    (copy / "run.json").write_text(json.dumps(info))
    page = open(cb.report.write_report(copy), encoding="utf-8").read()
    assert tag not in page and page.count(html.escape(tag)) >= 2
    view = RunView(str(copy)).state()
    assert tag not in json.dumps(view["sections"]) and html.escape(tag) in view["sections"]["headline"]
    info["seed"] = tag                                                 # numbers must be numbers
    (copy / "run.json").write_text(json.dumps(info))
    with pytest.raises(RunInfoError, match=r"its 'seed' must be a whole number, not '<img src=x onerror="):
        cb.load(copy)


@pytest.fixture(scope="module")
def chromium() -> str:
    return chromium_path()


def test_the_report_opens_in_headless_chromium_without_errors(run, chromium, tmp_path):
    page = cb.report.write_report(run.run_dir, tmp_path / "report.html")
    loaded = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}",
                             "--enable-logging=stderr", "--v=0", "--dump-dom", f"file://{page}"],
                            capture_output=True, text=True, timeout=120)
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    console = [line for line in loaded.stderr.splitlines() if ":CONSOLE" in line and "WebGL" not in line]
    assert not [line for line in console if "Uncaught" in line or "Error" in line], console
    dom = loaded.stdout
    gantt = dom[dom.index('id="figure-gantt"'):dom.index('id="figure-parallel"')]
    assert gantt.count('class="point"') == len(run.schedule())          # one bar per sub-epoch, drawn
    curves = dom[dom.index('id="figure-curves"'):dom.index('id="figure-best-so-far"')]
    panels = 3 + (run.history()["train_lr"].nunique() > 1)          # a curve per trial in each panel
    assert curves.count('class="trace scatter ') == panels * len(run.trials)
    best_so_far = dom[dom.index('id="figure-best-so-far"'):dom.index('id="figure-gantt"')]
    assert best_so_far.count('class="trace scatter ') == 3       # against time, each epoch, against trials
    shot = tmp_path / "report.png"
    subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile2'}",
                    f"--screenshot={shot}", f"file://{page}"], capture_output=True, timeout=120)
    with open(shot, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(shot) > 50_000


def test_mlflow_has_a_parent_run_a_nested_run_per_trial_and_the_best_model(tmp_path):
    from mlflow.tracking import MlflowClient
    result = cb.GridSearch(build, {"lr": cb.choice([1e-2, 3e-3]), "hidden": cb.choice([16])}, epochs=2,
                           metric="val_accuracy", mode="max").fit(digits(partitions=2), workers=2, seed=0, verbose=0,
                                                                  store=tmp_path / "run", mlflow=True)
    client = MlflowClient(f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cerebro")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and parents[0].data.tags["cerebro.best_trial"] == result.best.trial_id
    children = {r.data.tags["cerebro.trial_id"]: r for r in runs if r.data.tags.get("mlflow.parentRunId")
                == parents[0].info.run_id}
    assert sorted(children) == [t.trial_id for t in result.trials]
    history = result.history()
    for trial in result.trials:
        child = children[trial.trial_id]
        assert child.data.params["lr"] == json.dumps(trial.config["lr"]) and child.data.params["hidden"] == "16"
        assert child.data.tags["cerebro.status"] == "completed" and child.info.status == "FINISHED"
        logged = client.get_metric_history(child.info.run_id, "val_accuracy")
        rows = history[history.trial_id == trial.trial_id]
        assert [m.step for m in logged] == rows.epoch.tolist()
        assert [m.value for m in logged] == pytest.approx(rows.val_accuracy.tolist())
    import mlflow.pyfunc
    artifact = client.download_artifacts(parents[0].info.run_id, "best_model", str(tmp_path / "best"))
    model = mlflow.pyfunc.load_model(artifact)          # the best trial as a pyfunc model
    assert json.loads(model.metadata.metadata["cerebro"])["trial_id"] == result.best.trial_id
    rows = np.random.default_rng(0).random((5, 64)).astype(np.float32)
    assert np.array_equal(model.predict(rows), result.best.predict(rows))


class InterruptedOnce(cb.GridSearch):
    """Grid search whose driver gets a Ctrl-C at the first epoch end, the first time only."""

    def __init__(self, *args, marker: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.marker = marker

    def report(self, trial_id, epoch, metrics):
        if claim(self.marker):
            raise KeyboardInterrupt
        return super().report(trial_id, epoch, metrics)


def test_mlflow_marks_an_interrupted_run_killed_and_its_resume_carries_on_the_same_runs(tmp_path):
    from mlflow.tracking import MlflowClient
    search = InterruptedOnce(build, {"lr": cb.choice([1e-2, 3e-3])}, epochs=3, marker=str(tmp_path / "once"))
    with pytest.raises(KeyboardInterrupt):
        search.fit(digits(partitions=2), workers=2, seed=0, verbose=0, store=tmp_path / "run", mlflow=True)
    client = MlflowClient(f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("cerebro").experiment_id
    interrupted = client.search_runs([experiment])
    assert len(interrupted) == 3 and {r.info.status for r in interrupted} == {"KILLED"}   # parent, 2 trials

    result = cb.resume(tmp_path / "run", build, verbose=0)
    runs = client.search_runs([experiment])
    assert sorted(r.info.run_id for r in runs) == sorted(r.info.run_id for r in interrupted)
    assert {r.info.status for r in runs} == {"FINISHED"}
    children = {r.data.tags["cerebro.trial_id"]: r for r in runs if "mlflow.parentRunId" in r.data.tags}
    history = result.history()
    for trial in result.trials:
        logged = client.get_metric_history(children[trial.trial_id].info.run_id, "val_loss")
        rows = history[history.trial_id == trial.trial_id]     # an epoch redone on resume logs the same value
        assert {(m.step, m.value) for m in logged} == set(zip(rows.epoch, rows.val_loss.astype(float)))


def test_a_new_run_in_a_reused_directory_gets_new_mlflow_runs(tmp_path):
    from mlflow.tracking import MlflowClient
    uri = f"sqlite:///{tmp_path / 'tracking.db'}"      # a tracking store outside the run directory
    for _ in range(2):
        shutil.rmtree(tmp_path / "run", ignore_errors=True)
        cb.GridSearch(build, {"lr": cb.choice([1e-2])}, epochs=1).fit(digits(partitions=2), workers=2, seed=0,
                                                                      verbose=0, store=tmp_path / "run", mlflow=uri)
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("cerebro").experiment_id])
    parents = {r.info.run_id for r in runs if "mlflow.parentRunId" not in r.data.tags}
    children = [r.data.tags["mlflow.parentRunId"] for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 2 and sorted(children) == sorted(parents)     # one trial run under each


def test_mlflow_setting_is_checked(tmp_path):
    with pytest.raises(TypeError, match=r"^mlflow=3 must be True, False or a tracking URI such as "
                                        r"'http://host:5000'$"):
        cb.GridSearch(build, {"lr": cb.choice([1e-2])}, epochs=1).fit(digits(partitions=2), workers=2,
                                                                      store=tmp_path / "run", mlflow=3)
    assert not os.path.exists(tmp_path / "run")

"""Exports for serving: ONNX of a torch trial (dynamic batch, checked with onnxruntime)
matches its predictions within 1e-4, the exporter's warnings kept out of the terminal; an
MLflow pyfunc model predicts as the trial does within 1e-5, in another process, with the run
directory gone, and records the trial's config; a Keras trial's ONNX and TorchScript exports
are refused in one line saying what to do instead."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
from _models import build, digits

import cerebro as cb
from cerebro.cli import entry
from cerebro.serve import export_onnx

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> cb.Result:
    return cb.GridSearch(build, {"lr": cb.choice([1e-2])}, epochs=2).fit(
        digits(partitions=2), workers=2, store=tmp_path_factory.mktemp("e") / "run", seed=0, verbose=0)


def rows(count: int = 17) -> np.ndarray:
    return np.random.default_rng(1).random((count, 64)).astype(np.float32)


def test_onnx_export_predicts_as_the_trial_on_any_batch_size(run, tmp_path):
    onnxruntime = pytest.importorskip("onnxruntime")
    done = subprocess.run([sys.executable, "-m", "cerebro", "export", run.run_dir, "-o", str(tmp_path / "m.onnx")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""        # not torchvision's operators it skips, nor torch's deprecations
    session = onnxruntime.InferenceSession(str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"])
    for count in (1, 17, 64):
        got = session.run(None, {"features": rows(count)})[0]
        assert np.abs(got - run.best.predict(rows(count))).max() <= 1e-4


def test_an_mlflow_model_predicts_as_the_trial_without_the_run_directory(run, tmp_path):
    pytest.importorskip("mlflow")
    expected = run.best.predict(rows())
    done = subprocess.run([sys.executable, "-m", "cerebro", "export", run.run_dir, "--mlflow", "-o",
                           str(tmp_path / "model")], capture_output=True, text=True, timeout=600)
    assert (done.returncode, done.stderr) == (0, "")       # no warnings about how MLflow sees our model
    moved = shutil.move(run.run_dir, tmp_path / "gone")
    try:
        np.save(tmp_path / "rows.npy", rows())
        script = ("import json, sys, numpy as np, mlflow.pyfunc\n"
                  "model = mlflow.pyfunc.load_model(sys.argv[1])\n"
                  "np.save(sys.argv[3], model.predict(np.load(sys.argv[2])))\n"
                  "print(model.metadata.metadata['cerebro'])\n")
        loaded = subprocess.run([sys.executable, "-c", script, str(tmp_path / "model"), str(tmp_path / "rows.npy"),
                                 str(tmp_path / "out.npy")], capture_output=True, text=True, timeout=600,
                                cwd=tmp_path)
        assert loaded.returncode == 0, loaded.stderr
        assert np.abs(np.load(tmp_path / "out.npy") - expected).max() <= 1e-5
        recorded = json.loads(loaded.stdout.strip().splitlines()[-1])
        assert (recorded["trial_id"], recorded["config"], recorded["epoch"]) == \
            (run.best.trial_id, run.best.config, run.best.best_epoch)
    finally:
        shutil.move(moved, run.run_dir)


def test_a_keras_trials_onnx_and_torchscript_exports_are_refused_in_one_line(tmp_path, monkeypatch, capsys):
    pytest.importorskip("keras")
    from _keras_models import build as keras_build
    result = cb.GridSearch(keras_build, {"architecture": cb.choice(["plain"])}, epochs=1).fit(
        digits(partitions=2, rows=200), workers=2, store=tmp_path / "run", seed=0, verbose=0)
    with pytest.raises(ValueError, match=r"^t0000 is a KerasTrainable trial; ONNX export takes torch trials "
                                         r"\(save a Keras trial as model.keras\)$"):
        export_onnx(result.best, tmp_path / "m.onnx")
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)      # entry() sets its own
    monkeypatch.setattr(sys, "argv", ["cerebro", "export", result.run_dir, "--torchscript", "-o",
                                      str(tmp_path / "m.pt")])
    with pytest.raises(SystemExit) as exited:
        entry()
    assert (exited.value.code, capsys.readouterr().err) == (
        2, "error: t0000 is a KerasTrainable trial; TorchScript export takes torch trials (save a Keras trial as "
           "model.keras)\n")
    assert not (tmp_path / "m.pt").exists()

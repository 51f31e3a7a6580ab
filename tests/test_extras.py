"""A feature whose extra is not installed says so in one line that names the package and the
``pip install "cerebro[...]"`` that brings it: from Python a :class:`cerebro.MissingExtraError`
(an ``ImportError``) before any work starts; from the command line that line, exit 2, no
traceback. And every extra of ``pyproject.toml`` is named where a user reads how to install."""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import tomllib
import warnings

import numpy as np
import pytest

import cerebro as cb
from cerebro.cli import entry

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
EXTRAS = {"spark": ["pyspark"], "ray": ["ray"], "dask": ["dask", "distributed"], "mlflow": ["mlflow"],
          "onnx": ["onnx", "onnxruntime", "onnxscript"]}


@pytest.fixture
def without(monkeypatch):
    """``without("pyspark", ...)``: from now on in this test, importing those packages (and any
    module of theirs already loaded) fails as for a package that is not installed."""
    def absent(*packages: str) -> None:
        for name in [m for m in sys.modules if m.partition(".")[0] in packages] + list(packages):
            monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)    # entry() sets its own
    return absent


def test_every_extra_is_named_where_a_user_reads_how_to_install():
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    text = "".join(open(path, encoding="utf-8").read() for path in [os.path.join(ROOT, "README.md"),
                                                                    *glob.glob(os.path.join(ROOT, "docs", "*.md"))])
    unnamed = [name for name in extras if not re.search(rf'pip install[^\n`]*["\'.\w]\[([\w,]*,)?{name}[],]', text)]
    assert unnamed == []


@pytest.mark.parametrize("backend, arguments, package, extra", [
    ("SparkBackend", {}, "pyspark", "spark"),
    ("RayBackend", {"workers": 2}, "ray", "ray"),
    ("DaskBackend", {}, "distributed", "dask"),
])
def test_a_backend_whose_extra_is_missing_says_which_to_install(without, backend, arguments, package, extra):
    without(*EXTRAS[extra])
    with pytest.raises(cb.MissingExtraError) as raised:
        getattr(cb, backend)(**arguments)
    assert str(raised.value) == f'cb.{backend} needs {package}, which is not installed: pip install "cerebro[{extra}]"'
    assert isinstance(raised.value, ImportError) and raised.value.name == package


def test_spark_prediction_without_pyspark_says_which_to_install_before_reading_the_run(without, tmp_path):
    without(*EXTRAS["spark"])
    with pytest.raises(cb.MissingExtraError) as raised:
        cb.predict(tmp_path / "no-run-here", np.zeros((2, 2), np.float32), backend="spark")
    assert str(raised.value) == ("cb.predict(..., backend='spark') needs pyspark, which is not installed: "
                                 'pip install "cerebro[spark]"')


def test_sql_install_without_adbc_says_which_to_install(without, tmp_path):
    from cerebro.sql import install
    without("adbc_driver_postgresql")
    with pytest.raises(cb.MissingExtraError, match=r'^cerebro sql install needs adbc_driver_postgresql, which is not '
                                                   r'installed: pip install "cerebro\[sql\]"$'):
        install("postgresql://127.0.0.1:1/none", store_root=str(tmp_path))


def test_mlflow_logging_without_mlflow_is_refused_before_the_run_begins(without, tmp_path):
    import torch
    without("mlflow")

    def build(config):
        model = torch.nn.Linear(2, 2)
        return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                 torch.nn.functional.cross_entropy, batch_size=4)

    data = cb.Dataset.from_numpy(np.zeros((8, 2), np.float32), np.arange(8) % 2, partitions=2)
    with pytest.raises(cb.MissingExtraError, match=r'^mlflow=\.\.\. needs mlflow, which is not installed: '
                                                   r'pip install "cerebro\[mlflow\]"$'):
        cb.GridSearch(build, {"lr": 0.1}, epochs=1).fit(data, workers=1, store=tmp_path / "run", mlflow=True,
                                                       verbose=0)
    assert not (tmp_path / "run").exists()


EXPERIMENT = """
import numpy as np, torch, cerebro as cb
data = cb.Dataset.from_numpy(np.zeros((8, 2), np.float32), np.arange(8) % 2, partitions=2)
def build(config):
    model = torch.nn.Linear(2, 2)
    return cb.TorchTrainable(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.nn.functional.cross_entropy,
                             batch_size=4)
search = cb.GridSearch(build, {"lr": 0.1}, epochs=1)
"""


@pytest.mark.parametrize("args, extra, says", [
    (["export", "{run}", "--mlflow", "-o", "{run}/model"], "mlflow",
     'cerebro export --mlflow needs mlflow, which is not installed: pip install "cerebro[mlflow]"'),
    (["run", "{experiment}", "--backend", "spark"], "spark", 'pyspark is not installed: pip install "cerebro[spark]"'),
    (["run", "{experiment}", "--backend", "ray"], "ray",
     'cb.RayBackend needs ray, which is not installed: pip install "cerebro[ray]"'),
    (["run", "{experiment}", "--backend", "dask"], "dask",
     'distributed is not installed: pip install "cerebro[dask]"'),
], ids=["export --mlflow", "run --backend spark", "run --backend ray", "run --backend dask"])
def test_the_command_line_says_which_extra_to_install_in_one_line_and_exits_2(without, tmp_path, monkeypatch, capsys,
                                                                              args, extra, says):
    monkeypatch.chdir(tmp_path)
    experiment = tmp_path / "experiment.py"
    experiment.write_text(EXPERIMENT)
    without(*EXTRAS[extra])
    monkeypatch.setattr(sys, "argv", ["cerebro", *(a.format(run=tmp_path, experiment=experiment) for a in args)])
    with pytest.raises(SystemExit) as exited:
        entry()
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"error: {says}\n"
    assert sorted(os.listdir(tmp_path)) == ["experiment.py"]      # nothing written


def test_an_onnx_export_without_onnx_is_one_line_and_exit_2_in_a_python_without_it(tmp_path):
    """The real command in a Python where onnx, onnxruntime and onnxscript are not there."""
    done = subprocess.run([sys.executable, os.path.join(HERE, "_without.py"), ",".join(EXTRAS["onnx"]), "export",
                           str(tmp_path), "-o", str(tmp_path / "model.onnx")], capture_output=True, text=True,
                          timeout=300)
    assert (done.returncode, done.stderr) == (
        2, 'error: an ONNX export needs onnx, which is not installed: pip install "cerebro[onnx]"\n')
    assert not (tmp_path / "model.onnx").exists()
